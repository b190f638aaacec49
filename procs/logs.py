"""Every gpufleet daemon's log lines, set up once at start (`configure`): on stderr,
plain text (`time LEVEL logger: message`) or one JSON object per line (the
coordinator's `--log-format json`), with the structured fields access and audit lines
carry (`extra={"fields": {...}}`) kept as fields rather than flattened into the
message."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from msgspec import Meta

from procs.settings.model import Option

LogFormat = Literal["text", "json"]


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


# Every daemon's `log_level` setting (`--log-level debug` works too).
LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR"],
    Meta(description="log level"),
    Option(before=_upper),
]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """The classic line, with the structured fields appended as `k=v`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields:
            line += " " + " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        return line


def _text(value: Any) -> str:
    if isinstance(value, str) and value and " " not in value and "=" not in value:
        return value
    return json.dumps(value, default=str)


def configure(level: str | int, fmt: LogFormat = "text") -> None:
    """The root logger's one handler (stderr) and level; replaces any set before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
