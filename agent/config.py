"""The agent's one frozen settings object, built from a TOML file, `GPUFLEET_*` env vars
and command-line flags (flags win over env, env over the file).

Only this module and `agent.main` read the environment. Every check names the field it
rejects, so `gpufleet-agent` can exit with a message an operator can act on.

File keys (all optional except `pool_id`): `node_id`, `pool_id`, `nats_url`,
`nats_creds`, `subject_prefix`, `interval_s`, `simulate`, `sysfs_root`, `fault_file`,
`log_level`, `provisioning`, `profile_id`, `profile_version`, `[labels]`,
`[[sharing]]` (`gpus`, `mode`, `replicas`) and `[health]` (`recover_after_s`,
`xid_hold_s`, `xid_faults`, `xid_ignore`).
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.inventory import SharingRule
from agent.profile import ProfileError, load_profile
from shared.ids import NODE_ID_PATTERN, POOL_ID_PATTERN
from shared.subjects import Subjects

ENV_PREFIX = "GPUFLEET_"
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")
_TOP_KEYS = {
    "node_id",
    "pool_id",
    "nats_url",
    "nats_creds",
    "subject_prefix",
    "interval_s",
    "simulate",
    "sysfs_root",
    "fault_file",
    "log_level",
    "provisioning",
    "profile_id",
    "profile_version",
    "labels",
    "sharing",
    "health",
}
_HEALTH_KEYS = {"recover_after_s", "xid_hold_s", "xid_faults", "xid_ignore"}
# Env var → field; the env holds strings, converted like the file's values. Profile and
# health settings are file-only: they are tables or belong to the host's provisioning.
_ENV_FIELDS = tuple(sorted(_TOP_KEYS - {"profile_id", "profile_version", "health"}))


class ConfigError(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class HealthSettings:
    recover_after_s: float = 60.0
    xid_hold_s: float = 300.0
    xid_faults: tuple[int, ...] = ()  # added to the built-in fault list
    xid_ignore: tuple[int, ...] = ()  # removed from it (treated as application errors)


@dataclass(frozen=True)
class Settings:
    pool_id: str
    node_id: str
    nats_url: str = "nats://127.0.0.1:4222"
    nats_creds: Path | None = None
    subject_prefix: str = "gpufleet"
    interval_s: float = 5.0
    simulate: str | None = None
    sysfs_root: Path = Path("/")
    fault_file: Path | None = None
    log_level: str = "INFO"
    provisioning: bool = False
    profile_id: str | None = None
    profile_version: int | None = None
    labels: tuple[tuple[str, str], ...] = ()
    sharing: tuple[SharingRule, ...] = ()
    health: HealthSettings = field(default_factory=HealthSettings)


def load_settings(
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    config_file: Path | None = None,
) -> Settings:
    """Merge file < env < flags. `flags` holds only options given on the command line."""
    raw: dict[str, Any] = {}
    if config_file is not None:
        raw.update(_read_file(config_file))
    for name in _ENV_FIELDS:
        value = env.get(ENV_PREFIX + name.upper())
        if value is not None and value != "":
            if name == "labels":
                raw["labels"] = {**_mapping(raw.get("labels")), **parse_labels(value.split(","))}
            elif name == "sharing":
                raw["sharing"] = [parse_share(s) for s in value.split(";") if s.strip()]
            else:
                raw[name] = value
    for name, value in flags.items():
        if value is None:
            continue
        if name == "labels":
            raw["labels"] = {**_mapping(raw.get("labels")), **dict(value)}
        else:
            raw[name] = value
    return _build(raw)


def parse_labels(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.strip().partition("=")
        if not sep:
            raise ConfigError("labels", f"{item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def parse_share(text: str) -> dict[str, Any]:
    """`GPUS:MODE:REPLICAS`, e.g. `all:timeslice:4` or `0,1:mps:2`."""
    parts = text.strip().split(":")
    if len(parts) != 3:
        raise ConfigError("sharing", f"{text!r} is not GPUS:MODE:REPLICAS")
    gpus, mode, replicas = parts
    try:
        count = int(replicas)
    except ValueError:
        raise ConfigError("sharing", f"{text!r}: replicas must be an integer") from None
    return {"gpus": [g for g in gpus.split(",") if g], "mode": mode, "replicas": count}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", f"{path}: {exc}") from exc
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(unknown[0], f"unknown key in {path}")
    return data


def _mapping(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError("labels", "expected a table of strings")
    return {str(k): str(v) for k, v in value.items()}


def _build(raw: dict[str, Any]) -> Settings:
    pool_id = _text(raw, "pool_id", None)
    if not re.match(POOL_ID_PATTERN, pool_id):
        raise ConfigError("pool_id", f"{pool_id!r} does not match {POOL_ID_PATTERN}")
    node_id = _text(raw, "node_id", socket.gethostname())
    if not re.match(NODE_ID_PATTERN, node_id):
        raise ConfigError("node_id", f"{node_id!r} does not match {NODE_ID_PATTERN}")
    nats_url = _text(raw, "nats_url", "nats://127.0.0.1:4222")
    for url in nats_url.split(","):
        if not re.match(r"^(nats|tls|ws|wss)://[^\s/]+", url.strip()):
            raise ConfigError("nats_url", f"{url!r} is not a nats://host:port URL")
    prefix = _text(raw, "subject_prefix", "gpufleet")
    try:
        Subjects(prefix)
    except ValueError as exc:
        raise ConfigError("subject_prefix", str(exc)) from None
    interval = _number(raw, "interval_s", 5.0)
    if not 0.1 <= interval <= 3600:
        raise ConfigError("interval_s", "must be between 0.1 and 3600 seconds")
    sysfs_root = Path(_text(raw, "sysfs_root", "/"))
    if not sysfs_root.is_dir():
        raise ConfigError("sysfs_root", f"{sysfs_root} is not a directory")
    log_level = _text(raw, "log_level", "INFO").upper()
    if log_level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ConfigError("log_level", "must be DEBUG, INFO, WARNING or ERROR")
    labels = _mapping(raw.get("labels"))
    for key, value in labels.items():
        if not _LABEL_KEY.match(key):
            raise ConfigError(f"labels.{key}", "label keys are 1-63 of [A-Za-z0-9._/-]")
        if len(value) > 256:
            raise ConfigError(f"labels.{key}", "label values are at most 256 characters")
    simulate = _optional_text(raw, "simulate")
    if simulate is not None:
        try:
            load_profile(simulate)
        except ProfileError as exc:
            raise ConfigError("simulate", str(exc)) from None
    return Settings(
        pool_id=pool_id,
        node_id=node_id,
        nats_url=nats_url,
        nats_creds=_path(raw, "nats_creds", must_exist=True),
        subject_prefix=prefix,
        interval_s=interval,
        simulate=simulate,
        sysfs_root=sysfs_root,
        fault_file=_path(raw, "fault_file", must_exist=False),
        log_level=log_level,
        provisioning=_bool(raw, "provisioning"),
        profile_id=_optional_text(raw, "profile_id"),
        profile_version=_optional_int(raw, "profile_version"),
        labels=tuple(sorted(labels.items())),
        sharing=_sharing(raw.get("sharing", [])),
        health=_health(raw.get("health", {})),
    )


def _sharing(value: Any) -> tuple[SharingRule, ...]:
    if not isinstance(value, list):
        raise ConfigError("sharing", "expected an array of tables")
    rules: list[SharingRule] = []
    for i, entry in enumerate(value):
        where = f"sharing[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(where, "expected a table")
        gpus = entry.get("gpus", "all")
        gpu_list = [gpus] if isinstance(gpus, str | int) else gpus
        if not isinstance(gpu_list, list) or not gpu_list:
            raise ConfigError(f"{where}.gpus", 'expected "all", a GPU index, UUID or a list')
        mode = entry.get("mode")
        if mode not in ("timeslice", "mps"):
            raise ConfigError(f"{where}.mode", 'must be "timeslice" or "mps"')
        replicas = entry.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= 64:
            raise ConfigError(f"{where}.replicas", "must be an integer from 1 to 64")
        rules.append(
            SharingRule(gpus=tuple(str(g) for g in gpu_list), mode=mode, replicas=replicas)
        )
    return tuple(rules)


def _health(value: Any) -> HealthSettings:
    if not isinstance(value, dict):
        raise ConfigError("health", "expected a table")
    unknown = sorted(set(value) - _HEALTH_KEYS)
    if unknown:
        raise ConfigError(f"health.{unknown[0]}", "unknown key")
    recover = _number(value, "recover_after_s", 60.0, "health.")
    hold = _number(value, "xid_hold_s", 300.0, "health.")
    if recover < 0 or hold < 0:
        raise ConfigError("health", "times must not be negative")
    lists: dict[str, tuple[int, ...]] = {}
    for key in ("xid_faults", "xid_ignore"):
        items = value.get(key, [])
        if not isinstance(items, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in items
        ):
            raise ConfigError(f"health.{key}", "expected a list of positive XID numbers")
        lists[key] = tuple(items)
    return HealthSettings(
        recover_after_s=recover,
        xid_hold_s=hold,
        xid_faults=lists["xid_faults"],
        xid_ignore=lists["xid_ignore"],
    )


def _text(raw: dict[str, Any], key: str, default: str | None) -> str:
    value = raw.get(key, default)
    if value is None or value == "":
        raise ConfigError(key, "required")
    if not isinstance(value, str):
        raise ConfigError(key, "expected a string")
    return value


def _optional_text(raw: dict[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return None if value is None or value == "" else _text(raw, key, None)


def _optional_int(raw: dict[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(key, "expected an integer") from None


def _number(raw: dict[str, Any], key: str, default: float, where: str = "") -> float:
    value = raw.get(key, default)
    if isinstance(value, bool):
        raise ConfigError(where + key, "expected a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(where + key, "expected a number") from None


def _bool(raw: dict[str, Any], key: str) -> bool:
    value = raw.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {
        "1",
        "true",
        "yes",
        "on",
        "0",
        "false",
        "no",
        "off",
    }:
        return value.lower() in {"1", "true", "yes", "on"}
    raise ConfigError(key, "expected true or false")


def _path(raw: dict[str, Any], key: str, *, must_exist: bool) -> Path | None:
    value = raw.get(key)
    if value is None or value == "":
        return None
    path = Path(str(value))
    if must_exist and not path.is_file():
        raise ConfigError(key, f"{path} does not exist")
    return path


def environment() -> dict[str, str]:
    """The `GPUFLEET_*` part of the process environment (read only from main)."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
