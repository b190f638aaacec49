"""The agent's settings: one frozen model, from which `procs.settings` builds the flags,
reads `GPUFLEET_*` env and the TOML file (keys at the top level, `[labels]`,
`[[sharing]]`, `[health]`), and writes the table in docs/agent.md.

`python -m agent.config docs/agent.md` rewrites that table; a test fails when the doc
and the model disagree.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from agent.bookings_trust import default_max_age_ms
from agent.inventory import SharingRule
from agent.sim.profile import ProfileError, load_profile
from procs.logs import LogLevel
from procs.nats import NatsSettings
from procs.settings import ConfigError, DocTable, Option, SettingsModel
from shared.ids import NODE_ID_PATTERN, POOL_ID_PATTERN
from shared.wire import IDLE_UTIL_PERCENT, DeviceClass

__all__ = ["ConfigError", "HealthSettings", "Settings", "ShareSetting"]

# The daemon's TOML file (systemd/gpufleet-agent.service's): the one-shot commands read
# it when nothing names another and this user may read it.
DEFAULT_CONFIG = Path("/etc/gpufleet/agent.toml")

LabelKey = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")]
LabelValue = Annotated[str, Meta(max_length=256)]
# `all`, one GPU index or UUID, or a list of them.
GpuList = str | int | Annotated[tuple[str | int, ...], Meta(min_length=1)]
XidList = tuple[Annotated[int, Meta(gt=0)], ...]


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


def _label_text(value: Any) -> Any:
    # TOML gives `rack = 7` as a number; a label is text.
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return value


def readable(path: Path) -> bool:
    """Whether this user may read the file at `path`. A job's user may not even look
    into the role's /etc/gpufleet (0750), which Path.exists raises for (Python 3.11)."""
    try:
        return path.is_file() and os.access(path, os.R_OK)
    except OSError:
        return False


def _matches(pattern: str) -> Any:
    def check(value: str) -> None:
        if not re.match(pattern, value):
            raise ValueError(f"{value!r} does not match {pattern}")

    return check


def _is_dir(value: Path) -> None:
    if not value.is_dir():
        raise ValueError(f"{value} is not a directory")


def _profile(value: str | None) -> None:
    if value is not None:
        try:
            load_profile(value)
        except ProfileError as exc:
            raise ValueError(str(exc)) from None


class ShareSetting(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """GPUs (`all`, indexes or UUIDs) offered as `replicas` time-slice or MPS slots."""

    mode: Literal["timeslice", "mps"]
    replicas: Annotated[int, Meta(ge=1, le=64)]
    gpus: GpuList = "all"

    def rule(self) -> SharingRule:
        items = self.gpus if isinstance(self.gpus, tuple) else (self.gpus,)
        return SharingRule(
            gpus=tuple(str(g) for g in items), mode=self.mode, replicas=self.replicas
        )


class HealthSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    recover_after_s: Annotated[
        float,
        Meta(
            ge=0, description="seconds a GPU's health must stay better before it is reported better"
        ),
    ] = 60.0
    xid_hold_s: Annotated[
        float, Meta(ge=0, description="seconds a fault XID keeps a GPU unhealthy")
    ] = 300.0
    xid_faults: Annotated[XidList, Meta(description="XIDs added to the fault list")] = ()
    xid_ignore: Annotated[
        XidList, Meta(description="XIDs removed from it (treated as application errors)")
    ] = ()


class Settings(SettingsModel, frozen=True):
    prog = "gpufleet-agent"
    summary = "Inventory and health of one GPU host, published to NATS."
    epilog = (
        "\b\nCommands (each with its own --help; they read the same settings, the\n"
        "state directory included, from --config or GPUFLEET_CONFIG, else\n"
        "/etc/gpufleet/agent.toml):\n"
        "  inventory       read this host once and print what the agent would publish\n"
        "  bookings        this node's bookings as the agent last received them\n"
        "  env RSV_ID      shell exports that bind a workload to what RSV_ID booked"
    )

    pool_id: Annotated[
        str,
        Meta(description="the pool this host's GPUs belong to (`pool_...`)"),
        Option(check=_matches(POOL_ID_PATTERN)),
    ]
    node_id: Annotated[
        str,
        Meta(description="this host's node id"),
        Option(default_doc="the host name", check=_matches(NODE_ID_PATTERN)),
    ] = msgspec.field(default_factory=socket.gethostname)
    nats: NatsSettings = msgspec.field(default_factory=NatsSettings)
    interval_s: Annotated[
        float,
        Meta(ge=0.1, le=3600, description="seconds between polls (0.1 – 3600)"),
        Option(aliases=("--interval",)),
    ] = 5.0
    misses: Annotated[
        int,
        Meta(
            ge=1,
            le=100,
            description="the coordinator's `misses`: a silent NATS server is left for another"
            " within a third of misses × interval",
        ),
    ] = 3
    simulate: Annotated[
        str | None,
        Meta(description="simulated NVML from a host profile (name or `.toml` path)"),
        Option(check=_profile),
    ] = None
    sysfs_root: Annotated[
        Path,
        Meta(description="root of the sys/ and proc/ trees read"),
        Option(default_doc="`/` (simulated: a fake tree)", check=_is_dir),
    ] = Path("/")
    fault_file: Annotated[
        Path | None, Meta(description="simulated faults (JSON), re-read each poll")
    ] = None
    log_level: LogLevel = "INFO"
    idle_util_percent: Annotated[
        int,
        Meta(
            ge=0,
            le=100,
            description="the coordinator's idle threshold (SM %): a reading crossing it is"
            " sent at once (otherwise at most 60 s late)",
        ),
    ] = IDLE_UTIL_PERCENT
    provisioning: Annotated[bool, Meta(description="report the node as provisioning")] = False
    profile_id: Annotated[
        str | None,
        Meta(description="host profile id reported in the inventory"),
        Option(default_doc="the simulated profile's"),
    ] = None
    profile_version: Annotated[
        int | None,
        Meta(description="host profile version reported in the inventory"),
        Option(default_doc="the simulated profile's"),
    ] = None
    labels: Annotated[
        dict[LabelKey, LabelValue],
        Meta(description="node labels (a `[labels]` table); merged per key across sources"),
        Option(flag="--label", metavar="K=V", item=parse_label, separator=",", before=_label_text),
    ] = msgspec.field(default_factory=dict)
    sharing: Annotated[
        tuple[ShareSetting, ...],
        Meta(
            description=(
                "GPUs offered as N time-slice or MPS slots (`[[sharing]]` tables of `gpus`, "
                "`mode`, `replicas`), e.g. `all:timeslice:4`, `0,1:mps:2`"
            )
        ),
        Option(flag="--share", metavar="GPUS:MODE:N", item=parse_share, separator=";"),
    ] = ()
    expected: Annotated[
        dict[DeviceClass, Annotated[int, Meta(ge=0, le=4096)]],
        Meta(
            description=(
                "devices this host must have (an `[expected]` table, e.g. `gpu = 8`); a "
                "shortfall is reported as missing, unhealthy devices (simulated: the profile's)"
            )
        ),
        Option(flag="--expect", metavar="CLASS=N", item=parse_expect, separator=","),
    ] = msgspec.field(default_factory=dict)
    offer_boot_disks: Annotated[
        bool, Meta(description="offer the disk holding `/` (and its mirrors) as bookable")
    ] = False
    offer_management_nics: Annotated[
        bool, Meta(description="offer the management NIC(s) as bookable")
    ] = False
    management_nics: Annotated[
        tuple[str, ...],
        Meta(description="the management NICs by netdev name (default: the default route's)"),
        Option(flag="--management-nic", metavar="NAME", item=str, separator=","),
    ] = ()
    release_file: Annotated[
        Path | None,
        Meta(
            description=(
                "while this file exists the agent lets go of NVML (for a GPU reset or driver "
                "reload); SIGUSR1/SIGUSR2 do the same"
            )
        ),
    ] = None
    state_dir: Annotated[
        Path,
        Meta(description="where the agent keeps its state (systemd's `StateDirectory=`)"),
    ] = Path("/var/lib/gpufleet-agent")
    runtime_dir: Annotated[
        Path,
        Meta(
            description=(
                "where the agent writes what every user on the host may read: `gpus.json`,"
                " the GPU map `gres-uuids` reads (systemd's `RuntimeDirectory=`, 0755)"
            )
        ),
    ] = Path("/run/gpufleet-agent")
    bookings_file: Annotated[
        Path | None,
        Meta(
            description=(
                "the node's bookings as last received, for `gpufleet-agent bookings`/`env`"
                " and launchers (written atomically)"
            )
        ),
        Option(default_doc="`bookings.json` in `state_dir`"),
    ] = None
    bookings_max_age_s: Annotated[
        Annotated[float, Meta(gt=0, le=30 * 86400)] | None,
        Meta(
            description=(
                "`gpufleet-agent env` and `gres-uuids` refuse (exit 3) bookings or a"
                " GPU map the agent last confirmed longer ago than this"
            ),
        ),
        Option(aliases=("--max-age",), default_doc="misses × interval_s + 5 s (20 s)"),
    ] = None
    nfd_features_dir: Annotated[
        Path | None,
        Meta(
            description=(
                "write a Node Feature Discovery `local` feature file `gpufleet` here, e.g."
                " `/etc/kubernetes/node-feature-discovery/features.d` (off when unset)"
            )
        ),
    ] = None
    health: HealthSettings = msgspec.field(default_factory=HealthSettings)

    @property
    def sharing_rules(self) -> tuple[SharingRule, ...]:
        return tuple(s.rule() for s in self.sharing)

    @property
    def bookings_path(self) -> Path:
        return self.bookings_file or self.state_dir / "bookings.json"

    @property
    def bookings_max_age_ms(self) -> int:
        if self.bookings_max_age_s is not None:
            return round(self.bookings_max_age_s * 1000)
        return default_max_age_ms(self.interval_s, self.misses)

    @property
    def label_pairs(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.labels.items()))


DOC_TABLE = DocTable(Settings, "settings", "agent.config", "docs/agent.md")


if __name__ == "__main__":
    DOC_TABLE.main()
