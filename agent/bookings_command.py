"""`gpufleet-agent bookings` and `gpufleet-agent env RSV_ID`: the node's bookings as
the agent last received them (its state file, `bookings_file`), with no NATS.

`bookings` prints a table (or `--json`: the file's content). `env RSV_ID` prints
shell-evaluable lines for a launcher to bind a workload to exactly what it booked:

    export CUDA_VISIBLE_DEVICES=GPU-…,MIG-…   # GPU or MIG UUIDs, in device index order
    export NVIDIA_VISIBLE_DEVICES=…           # the same, for the NVIDIA container runtime
    export GPUFLEET_RESERVATION_ID=rsv_…
    export GPUFLEET_NIC_VFS=0000:…,…          # NIC VF PCI addresses (may be empty)
    export GPUFLEET_DISKS=…                   # disk ids (may be empty)

A reservation that is not live on this node now (not on it, not started, ended) is an
error on stderr with exit code 3, and so are bookings the agent has not confirmed for
longer than `bookings_max_age_s` (`--max-age`; agent.bookings_trust); a missing or
unreadable state file, one that names another node, or bad settings exit 2. Only in a
terminal is a hint on how to apply the lines added (on stderr), so
`eval "$(gpufleet-agent env RSV_ID)"` sees the lines alone.

`bookings` refuses another node's file too, and shows how long ago the agent confirmed
the bookings (the table's first line; `checkedAt`, `ageMs`, `maxAgeMs` in `--json`),
with a warning on stderr past the limit.

The settings are the daemon's: its TOML file is read, as the unit passes it, when
neither `--config` nor `GPUFLEET_CONFIG` names one and it exists; that is where
`node_id`, `interval_s`, `misses` and the state file's path come from.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from agent.bookings import read_held
from agent.bookings_trust import Held, StaleStateFile, span, trust
from agent.config import DEFAULT_CONFIG, Settings, readable
from agent.errors import CONFIG, AgentError, NotLive, exit_status
from procs.settings import ConfigError, load
from shared.wire import NodeBooking, NodeBookings

PLACEHOLDER_POOL = "pool_" + "0" * 26
USAGE = (
    "usage: gpufleet-agent bookings [--json] [agent settings flags]\n"
    "       gpufleet-agent env RSV_ID [--max-age SECONDS] [agent settings flags]"
)
GPU_CLASSES = ("gpu", "gpu.mig", "gpu.slot")


def state_at(b: NodeBooking, now_ms: int) -> str:
    """The booking's state by this host's clock (the file may be older than a boundary)."""
    if now_ms >= b.end:
        return "ended"
    if now_ms < b.start:
        return "scheduled"
    return b.state if b.state in ("active", "noticed") else "active"


def env_lines(bookings: NodeBookings, reservation_id: str, now_ms: int) -> list[str]:
    """The lines `env` prints; `NotLive` (the message) when not live here now."""
    found = next((b for b in bookings.bookings if b.reservation_id == reservation_id), None)
    node = bookings.node_id
    if found is None:
        raise NotLive(f"reservation {reservation_id} has no booking on node {node}")
    state = state_at(found, now_ms)
    if state == "scheduled":
        raise NotLive(
            f"reservation {reservation_id} is not live on node {node} yet: it starts at"
            f" {_when(found.start)}"
        )
    if state == "ended":
        raise NotLive(
            f"reservation {reservation_id} is not live on node {node}: it ended at"
            f" {_when(found.end)}"
        )
    gpus: list[str] = []
    for d in found.devices:  # in device index order; a GPU's slots name it once
        if d.cls in GPU_CLASSES and d.device_id and d.device_id not in gpus:
            gpus.append(d.device_id)
    vfs = [d.pci_address for d in found.devices if d.cls == "nic.vf" and d.pci_address]
    disks = [d.device_id for d in found.devices if d.cls == "disk" and d.device_id]
    values = {
        "CUDA_VISIBLE_DEVICES": ",".join(gpus),
        "NVIDIA_VISIBLE_DEVICES": ",".join(gpus) or "none",
        "GPUFLEET_RESERVATION_ID": reservation_id,
        "GPUFLEET_NIC_VFS": ",".join(vfs),
        "GPUFLEET_DISKS": ",".join(disks),
    }
    return [f"export {name}={shlex.quote(value)}" for name, value in values.items()]


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def table(held: Held, now_ms: int, max_age_ms: int) -> str:
    bookings = held.bookings
    rows = [("RESERVATION", "TENANT", "STATE", "START", "END", "DEVICES")]
    for b in bookings.bookings:
        counts: dict[str, int] = {}
        for d in b.devices:
            counts[d.cls] = counts.get(d.cls, 0) + 1
        devices = ", ".join(f"{n} {cls}" for cls, n in counts.items()) or "-"
        rows.append(
            (
                b.reservation_id,
                b.tenant_id,
                state_at(b, now_ms),
                _when(b.start),
                _when(b.end),
                devices,
            )
        )
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    head = (
        f"node {bookings.node_id}: {len(bookings.bookings)} booking(s), etag {bookings.etag},"
        f" sent {_when(bookings.sent_at)}; confirmed {span(held.age_ms(now_ms))} ago"
        f" (max {span(max_age_ms)})"
    )
    return "\n".join([head, *lines])


def as_json(held: Held, now_ms: int, max_age_ms: int) -> str:
    """The file's content, and the age: when the agent confirmed it, how long ago."""
    body = msgspec.to_builtins(held.bookings)
    body |= {"checkedAt": held.checked_at, "ageMs": held.age_ms(now_ms), "maxAgeMs": max_age_ms}
    return json.dumps(body, indent=2)


def main(argv: Sequence[str], env: Mapping[str, str], default_config: Path = DEFAULT_CONFIG) -> int:
    """`argv` starts with the subcommand (`bookings` or `env`)."""
    command, rest = argv[0], [a for a in argv[1:] if a != "--json"]
    json_out = len(rest) < len(argv) - 1
    words = rest[:1] if command == "env" and rest and not rest[0].startswith("-") else []
    rest = rest[len(words) :]
    if command == "env" and not words:
        print(USAGE, file=sys.stderr)
        return CONFIG
    if not _names_config(rest, env) and readable(default_config):
        env = {**env, Settings.config_env: str(default_config)}
    try:
        settings = load(Settings, rest, env, defaults={"pool_id": PLACEHOLDER_POOL})
        held = read_held(settings.bookings_path)
    except (ConfigError, AgentError) as exc:
        return exit_status(exc, command)
    now_ms = int(time.time() * 1000)
    max_age_ms = settings.bookings_max_age_ms
    try:
        trust(held, settings.node_id, now_ms, max_age_ms)
    except StaleStateFile as exc:
        if command == "env":
            return exit_status(exc, command)
        print(f"gpufleet-agent {command}: warning: {exc}", file=sys.stderr)
    except AgentError as exc:
        return exit_status(exc, command)
    if command == "bookings":
        print(as_json(held, now_ms, max_age_ms) if json_out else table(held, now_ms, max_age_ms))
        return 0
    try:
        lines = env_lines(held.bookings, words[0], now_ms)
    except NotLive as exc:
        return exit_status(exc, command)
    print("\n".join(lines))
    if sys.stdout.isatty():
        print(f'# to apply: eval "$(gpufleet-agent env {words[0]})"', file=sys.stderr)
    return 0


def _names_config(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    given = any(a == "--config" or a.startswith("--config=") for a in argv)
    return given or bool(env.get(Settings.config_env))
