"""The agent's settings: one frozen model, from which `shared.settings` builds the flags,
reads `GPUFLEET_*` env and the TOML file (keys at the top level, `[labels]`,
`[[sharing]]`, `[health]`), and writes the table in docs/agent.md.

`python -m agent.config docs/agent.md` rewrites that table; a test fails when the doc
and the model disagree.
"""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PositiveInt, field_validator

from agent.inventory import SharingRule
from agent.profile import ProfileError, load_profile
from shared.ids import NODE_ID_PATTERN, POOL_ID_PATTERN
from shared.settings import ConfigError, Option, SettingsModel, markdown_table, with_table
from shared.subjects import Subjects
from shared.wire import DeviceClass

__all__ = ["ConfigError", "HealthSettings", "Settings", "ShareSetting"]

_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


def _label_key(key: str) -> str:
    if not _LABEL_KEY.match(key):
        raise ValueError("label keys are 1-63 of [A-Za-z0-9._/-]")
    return key


LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, Field(max_length=256)]


def parse_label(text: str) -> dict[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r} is not key=value")
    return {key.strip(): value.strip()}


def parse_expect(text: str) -> dict[str, str]:
    """`CLASS=N`, e.g. `gpu=8`."""
    cls, sep, count = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r} is not CLASS=N")
    return {cls.strip(): count.strip()}


def parse_share(text: str) -> dict[str, Any]:
    """`GPUS:MODE:REPLICAS`, e.g. `all:timeslice:4` or `0,1:mps:2`."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"{text!r} is not GPUS:MODE:REPLICAS")
    gpus, mode, replicas = parts
    return {"gpus": [g for g in gpus.split(",") if g], "mode": mode, "replicas": replicas}


class ShareSetting(BaseModel):
    """GPUs (`all`, indexes or UUIDs) offered as `replicas` time-slice or MPS slots."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: tuple[str, ...] = ("all",)
    mode: Literal["timeslice", "mps"]
    replicas: int = Field(ge=1, le=64)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpu_list(cls, value: Any) -> Any:
        items = [value] if isinstance(value, str | int) else value
        if not isinstance(items, list | tuple) or not items:
            raise ValueError('expected "all", a GPU index, UUID or a list')
        return tuple(str(g) for g in items)

    def rule(self) -> SharingRule:
        return SharingRule(gpus=self.gpus, mode=self.mode, replicas=self.replicas)


class HealthSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    recover_after_s: float = Field(
        60.0,
        ge=0,
        description="seconds a GPU's health must stay better before it is reported better",
    )
    xid_hold_s: float = Field(300.0, ge=0, description="seconds a fault XID keeps a GPU unhealthy")
    xid_faults: tuple[PositiveInt, ...] = Field((), description="XIDs added to the fault list")
    xid_ignore: tuple[PositiveInt, ...] = Field(
        (), description="XIDs removed from it (treated as application errors)"
    )


class Settings(SettingsModel):
    prog = "gpufleet-agent"
    summary = "Inventory and health of one GPU host, published to NATS."

    pool_id: str = Field(description="the pool this host's GPUs belong to (`pool_...`)")
    node_id: Annotated[str, Option(default_doc="the host name")] = Field(
        default_factory=socket.gethostname, description="this host's node id"
    )
    nats_url: str = Field(
        "nats://127.0.0.1:4222", description="NATS server URL; a comma-separated list allowed"
    )
    nats_credentials: Annotated[Path | None, Option(deprecated=("nats_creds",))] = Field(
        None, description="NATS credentials file (`.creds` or `gpufleet nats-auth` TOML)"
    )
    subject_prefix: str = Field("gpufleet", description="NATS subject prefix")
    interval_s: Annotated[float, Option(aliases=("--interval",))] = Field(
        5.0, ge=0.1, le=3600, description="seconds between polls (0.1 – 3600)"
    )
    simulate: str | None = Field(
        None, description="simulated NVML from a host profile (name or `.toml` path)"
    )
    sysfs_root: Annotated[Path, Option(default_doc="`/` (simulated: a fake tree)")] = Field(
        Path("/"), description="root of the sys/ and proc/ trees read"
    )
    fault_file: Path | None = Field(None, description="simulated faults (JSON), re-read each poll")
    log_level: LogLevel = Field("INFO", description="log level")
    provisioning: bool = Field(False, description="report the node as provisioning")
    profile_id: Annotated[str | None, Option(default_doc="the simulated profile's")] = Field(
        None, description="host profile id reported in the inventory"
    )
    profile_version: Annotated[int | None, Option(default_doc="the simulated profile's")] = Field(
        None, description="host profile version reported in the inventory"
    )
    labels: Annotated[
        dict[LabelKey, LabelValue],
        Option(flag="--label", metavar="K=V", item=parse_label, separator=","),
    ] = Field(
        default_factory=dict,
        description="node labels (a `[labels]` table); merged per key across sources",
    )
    sharing: Annotated[
        tuple[ShareSetting, ...],
        Option(flag="--share", metavar="GPUS:MODE:N", item=parse_share, separator=";"),
    ] = Field(
        (),
        description=(
            "GPUs offered as N time-slice or MPS slots (`[[sharing]]` tables of `gpus`, `mode`, "
            "`replicas`), e.g. `all:timeslice:4`, `0,1:mps:2`"
        ),
    )
    expected: Annotated[
        dict[DeviceClass, Annotated[int, Field(ge=0, le=4096)]],
        Option(flag="--expect", metavar="CLASS=N", item=parse_expect, separator=","),
    ] = Field(
        default_factory=dict,
        description=(
            "devices this host must have (an `[expected]` table, e.g. `gpu = 8`); a shortfall is "
            "reported as missing, unhealthy devices (simulated: the profile's)"
        ),
    )
    offer_boot_disks: bool = Field(
        False, description="offer the disk holding `/` (and its mirrors) as bookable"
    )
    offer_management_nics: bool = Field(
        False, description="offer the management NIC(s) as bookable"
    )
    management_nics: Annotated[
        tuple[str, ...], Option(flag="--management-nic", metavar="NAME", item=str, separator=",")
    ] = Field((), description="the management NICs by netdev name (default: the default route's)")
    release_file: Path | None = Field(
        None,
        description=(
            "while this file exists the agent lets go of NVML (for a GPU reset or driver "
            "reload); SIGUSR1/SIGUSR2 do the same"
        ),
    )
    health: HealthSettings = Field(default_factory=HealthSettings)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("pool_id")
    @classmethod
    def _pool_id(cls, value: str) -> str:
        if not re.match(POOL_ID_PATTERN, value):
            raise ValueError(f"{value!r} does not match {POOL_ID_PATTERN}")
        return value

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, value: str) -> str:
        if not re.match(NODE_ID_PATTERN, value):
            raise ValueError(f"{value!r} does not match {NODE_ID_PATTERN}")
        return value

    @field_validator("nats_url")
    @classmethod
    def _nats_url(cls, value: str) -> str:
        for url in value.split(","):
            if not re.match(r"^(nats|tls|ws|wss)://[^\s/]+", url.strip()):
                raise ValueError(f"{url!r} is not a nats://host:port URL")
        return value

    @field_validator("nats_credentials")
    @classmethod
    def _credentials(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} does not exist")
        return value

    @field_validator("subject_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        Subjects(value)
        return value

    @field_validator("sysfs_root")
    @classmethod
    def _sysfs_root(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(f"{value} is not a directory")
        return value

    @field_validator("simulate")
    @classmethod
    def _profile(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                load_profile(value)
            except ProfileError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("labels", mode="before")
    @classmethod
    def _label_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value

    @property
    def sharing_rules(self) -> tuple[SharingRule, ...]:
        return tuple(s.rule() for s in self.sharing)

    @property
    def label_pairs(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.labels.items()))


BEGIN = "<!-- settings:begin (generated by `python -m agent.config docs/agent.md`) -->"
END = "<!-- settings:end -->"


def with_settings_table(text: str) -> str:
    return with_table(text, BEGIN, END, markdown_table(Settings))


if __name__ == "__main__":
    doc = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/agent.md")
    doc.write_text(with_settings_table(doc.read_text()))
