"""Pure: health counters and XID events → device and node health, with hysteresis.

A device gets worse at once and better only after its condition has stayed clear for
`recover_after_s`, so a flapping GPU does not storm the coordinator with transitions.
An XID fault is an event, not a condition: it counts as a condition for `xid_hold_s`
after the last such event. Thermal and power slowdown only ever make a device
`degraded`. The node is `unmonitored` while NVML is unusable (never silently healthy),
`unhealthy` when every GPU is, `degraded` when some device is not healthy.

Time is an argument (`now`, monotonic seconds), so tests drive it with a fake clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from agent.readings import GpuCounters, XidEvent
from agent.xid import XidTable
from shared.wire import DeviceHealth, HealthStatus, NodeHealth

_RANK: dict[str, int] = {"healthy": 0, "degraded": 1, "unhealthy": 2, "unmonitored": 3}
MAX_REASONS = 4
MAX_REASON_CHARS = 120


@dataclass(frozen=True)
class HealthPolicy:
    xids: XidTable = field(default_factory=XidTable)
    recover_after_s: float = 60.0
    xid_hold_s: float = 300.0
    retired_pages_limit: int = 60


@dataclass(frozen=True)
class DeviceState:
    status: HealthStatus = "healthy"
    reasons: tuple[str, ...] = ()
    clear_since: float | None = None  # when the raw condition last became better
    xid_until: float = 0.0
    xid_reason: str = ""


@dataclass(frozen=True)
class HealthState:
    devices: Mapping[str, DeviceState] = field(default_factory=lambda: MappingProxyType({}))
    node: NodeHealth = field(default_factory=lambda: NodeHealth(status="healthy"))

    def unhealthy_devices(self) -> tuple[DeviceHealth, ...]:
        """Every device that is not healthy now, for heartbeats (absent means healthy)."""
        return tuple(
            DeviceHealth(device_id=d, status=s.status, reasons=_cap(s.reasons))
            for d, s in sorted(self.devices.items())
            if s.status != "healthy"
        )


def findings(c: GpuCounters, policy: HealthPolicy) -> list[tuple[HealthStatus, str]]:
    """The raw conditions of one GPU right now, worst first."""
    out: list[tuple[HealthStatus, str]] = []
    if c.lost:
        return [("unhealthy", "GPU is lost (NVML_ERROR_GPU_IS_LOST)")]
    if c.dbe_volatile:
        out.append(("unhealthy", f"volatile double-bit ECC errors: {c.dbe_volatile}"))
    if c.retired_pending:
        out.append(("unhealthy", "page retirement pending (reset needed)"))
    if c.retired_pages is not None and c.retired_pages >= policy.retired_pages_limit:
        out.append(("unhealthy", f"retired pages: {c.retired_pages}"))
    if c.remap_failure:
        out.append(("unhealthy", "row remapping failure"))
    if c.remap_pending:
        out.append(("unhealthy", "row remapping pending (reset needed)"))
    if c.nvlink_down:
        links = ",".join(str(x) for x in c.nvlink_down)
        out.append(("unhealthy", f"NVLink down: link {links}"))
    if c.thermal_slowdown:
        out.append(("degraded", "thermal slowdown"))
    if c.power_slowdown:
        out.append(("degraded", "power brake slowdown"))
    return out


def evaluate(
    prev: HealthState,
    counters: Iterable[GpuCounters],
    xids: Iterable[XidEvent],
    now: float,
    policy: HealthPolicy,
    nvml_error: str | None = None,
) -> HealthState:
    if nvml_error is not None:
        # Nothing is known about the devices; keep their last states, flag the node.
        return HealthState(prev.devices, NodeHealth(status="unmonitored", reasons=(nvml_error,)))
    by_uuid: dict[str, list[XidEvent]] = {}
    for event in xids:
        if policy.xids.classify(event.xid) == "fault":
            by_uuid.setdefault(event.uuid, []).append(event)
    devices: dict[str, DeviceState] = {}
    for c in counters:
        old = prev.devices.get(c.uuid, DeviceState())
        xid_until, xid_reason = old.xid_until, old.xid_reason
        for event in by_uuid.get(c.uuid, []):
            xid_until = max(xid_until, event.at + policy.xid_hold_s)
            xid_reason = policy.xids.describe(event.xid)
        raw = findings(c, policy)
        if now < xid_until:
            raw.insert(0, ("unhealthy", xid_reason))
        devices[c.uuid] = _step(old, raw, now, policy, xid_until, xid_reason)
    return HealthState(MappingProxyType(devices), _node(devices))


def _step(
    old: DeviceState,
    raw: list[tuple[HealthStatus, str]],
    now: float,
    policy: HealthPolicy,
    xid_until: float,
    xid_reason: str,
) -> DeviceState:
    status: HealthStatus = "healthy"
    for level, _ in raw:
        if _RANK[level] > _RANK[status]:
            status = level
    reasons = tuple(r for _, r in raw)
    if _RANK[status] >= _RANK[old.status]:
        return DeviceState(status, reasons, None, xid_until, xid_reason)
    # Better than reported: wait until it has stayed better for recover_after_s.
    since = old.clear_since if old.clear_since is not None else now
    if now - since >= policy.recover_after_s:
        return DeviceState(status, reasons, None, xid_until, xid_reason)
    return DeviceState(old.status, old.reasons, since, xid_until, xid_reason)


def _node(devices: Mapping[str, DeviceState]) -> NodeHealth:
    bad = {d: s for d, s in devices.items() if s.status != "healthy"}
    if not bad:
        return NodeHealth(status="healthy")
    status: HealthStatus = "degraded"
    if all(s.status == "unhealthy" for s in devices.values()):
        status = "unhealthy"
    reasons = [
        f"{d}: {s.status}: {s.reasons[0] if s.reasons else ''}" for d, s in sorted(bad.items())
    ]
    return NodeHealth(status=status, reasons=_cap(tuple(reasons)))


def _cap(reasons: tuple[str, ...]) -> tuple[str, ...]:
    """Keep heartbeats small (< 1 KiB normally) however many conditions a device has."""
    return tuple(r[:MAX_REASON_CHARS] for r in reasons[:MAX_REASONS])
