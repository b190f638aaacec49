"""Coordinator settings: one frozen object built in `main` from a TOML file, `GPUFLEET_*`
environment variables and command-line flags (flags win, then env, then file).

Nothing else in the coordinator reads the environment.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shared.subjects import DEFAULT_PREFIX


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field."""


def default_database_url(state_dir: str) -> str:
    return f"sqlite:///{Path(state_dir) / 'gpufleet.db'}"


class CoordinatorSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    database_url: str = ""
    state_dir: str = "."
    nats_url: str = "nats://127.0.0.1:4222"
    nats_credentials: str | None = None
    subject_prefix: str = DEFAULT_PREFIX
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    misses: int = Field(default=3, ge=1, le=100)
    recovery_hold_s: float = Field(default=10.0, ge=0, le=3600)
    flush_interval_s: float = Field(default=1.0, gt=0, le=60)
    sweep_interval_s: float = Field(default=0.5, gt=0, le=60)
    rebuild_interval_s: float = Field(default=10.0, gt=0, le=3600)
    reservation_tick_s: float = Field(default=1.0, gt=0, le=60)
    notice_s: float = Field(default=120.0, ge=0, le=86400)
    alert_stream_max_msgs: int = Field(default=100_000, ge=1)
    alert_stream_max_age_s: float = Field(default=7 * 86400, gt=0)
    bootstrap_operator_key: str | None = None
    log_level: str = "INFO"

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        if v.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
        return v.upper()

    @property
    def effective_database_url(self) -> str:
        return self.database_url or default_database_url(self.state_dir)


_FIELDS = tuple(CoordinatorSettings.model_fields)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _FIELDS:
        key = "GPUFLEET_" + name.upper()
        if key in env:
            out[name] = env[key]
    # systemd's StateDirectory= tells us where to keep the SQLite file.
    if "state_dir" not in out and "STATE_DIRECTORY" in env:
        out["state_dir"] = env["STATE_DIRECTORY"].split(":")[0]
    return out


def _from_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    section = data.get("coordinator", data)
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: [coordinator] must be a table")
    return {k.replace("-", "_"): v for k, v in section.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML file ([coordinator] table)")
    parser.add_argument("--database-url", dest="database_url")
    parser.add_argument("--state-dir", dest="state_dir")
    parser.add_argument("--nats-url", dest="nats_url")
    parser.add_argument(
        "--nats-credentials", dest="nats_credentials", help="user/password TOML or .creds"
    )
    parser.add_argument("--subject-prefix", dest="subject_prefix")
    parser.add_argument("--host", dest="http_host")
    parser.add_argument("--port", dest="http_port", type=int)
    parser.add_argument("--misses", type=int)
    parser.add_argument("--bootstrap-operator-key", dest="bootstrap_operator_key")
    parser.add_argument("--log-level", dest="log_level")


def load_settings(args: argparse.Namespace, env: Mapping[str, str]) -> CoordinatorSettings:
    merged: dict[str, Any] = {}
    if getattr(args, "config", None):
        merged |= _from_file(args.config)
    merged |= _from_env(env)
    merged |= {k: v for k, v in vars(args).items() if k in _FIELDS and v is not None}
    try:
        return CoordinatorSettings.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(settings)'}: {e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(f"invalid coordinator configuration: {problems}") from None


def settings_from_argv(argv: Sequence[str] | None, env: Mapping[str, str]) -> CoordinatorSettings:
    parser = argparse.ArgumentParser(prog="gpufleet-coordinator")
    add_arguments(parser)
    return load_settings(parser.parse_args(argv), env)
