"""Pure: health counters, XID events and device findings → device and node health, with
hysteresis.

A device gets worse at once and better only after its condition has stayed clear for
`recover_after_s`, so a flapping GPU does not storm the coordinator with transitions.
XIDs are events, classified by `agent.xid`: a reset-class XID holds the device until a
reset is seen — NVML's recovery action field reads NONE, or (where the driver has no such
field) the GPU went away and came back (lost, unreadable, NVML down or released) — never
on a timer; an operator-added fault XID holds it for `xid_hold_s` after the last event.
Counters that only matter as bursts (PCIe replays, NVLink CRC/replay/recovery errors) are
compared with a baseline at most a minute old, DCGM's window. Thermal and power slowdown,
PCIe downtraining, pending MIG or ECC mode changes, a corrupted InfoROM, temperatures at
the slowdown threshold and the hardware-slowdown bit only ever make a device `degraded`;
an NVSwitch no longer reached and a fabric route or configuration fault make it
`unhealthy` (the fabric health mask's table is `fabric_findings`).

A GPU NVML cannot read stays in the input (its counters say `unreadable`), so it stays
unhealthy rather than vanishing; a device absent from the input has left the inventory.
The node is `unmonitored` while NVML is unusable (never silently healthy), `unhealthy`
when every GPU is, `degraded` when any device is not healthy. Devices outside NVML (NICs,
placeholders) are judged whether or not NVML answers. An acting XID whose GPU could not
be named (its UUID unreadable: filed under `unknown`) is kept at node level — the node
`degraded` with the XID as a reason — for `xid_hold_s`, never dropped.

Time is an argument (`now`, monotonic seconds), so tests drive it with a fake clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

import msgspec

from agent.burst_window import CounterWindow
from agent.readings import GpuCounters, XidEvent
from agent.xid import XidTable
from shared.wire import DeviceHealth, HealthStatus, NodeHealth

Finding = tuple[HealthStatus, str]

_RANK: dict[str, int] = {"healthy": 0, "degraded": 1, "unhealthy": 2, "unmonitored": 3}
MAX_REASONS = 4
MAX_REASON_CHARS = 120
RATE_WINDOW_S = 60.0
_RECOVERY_ACTIONS = {
    1: "GPU reset required",
    2: "node reboot required",
    3: "drain peer-to-peer traffic",
    4: "drain and reset",
    5: "recover IMEX domain",
    6: "PCIe bus reset required",
    7: "system reboot required",
}

# nvmlGpuFabricInfo_v2/v3 healthMask fields (NVML_GPU_FABRIC_HEALTH_MASK_*): name → (shift,
# width); each 2-bit flag reads 0 not supported, 1 true, 2 false. Values are NVML's ABI.
_MASK_TRUE = 1
_FABRIC_FLAGS: tuple[tuple[str, int, HealthStatus], ...] = (
    ("route unhealthy", 4, "unhealthy"),
    ("degraded bandwidth", 0, "degraded"),
    ("route recovery in progress", 2, "degraded"),
    ("access timeout recovery in progress", 6, "degraded"),
)
_FABRIC_CONFIG_SHIFT = 8  # 4 bits: 0 not supported, 1 none, else what is wrong
_FABRIC_CONFIG = {
    2: "incorrect system GUID",
    3: "incorrect chassis serial number",
    4: "no partition",
    5: "insufficient NVLinks",
    6: "incompatible GPU firmware",
    7: "invalid location",
    8: "GPU state invalid",
}
_FABRIC_GFM_SHIFT = 14  # 2 bits: 0 not supported, 1 connected, 2 disconnected
_FABRIC_SUMMARY: dict[int, Finding] = {  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*
    2: ("unhealthy", "fabric: health summary unhealthy"),
    3: ("degraded", "fabric: health summary limited capacity"),
}
_ECC = {0: "disabled", 1: "enabled"}


def fabric_findings(mask: int, summary: int | None) -> list[Finding]:
    """The fabric health mask and summary (nvmlDeviceGetGpuFabricInfoV) as findings: a
    route that cannot carry traffic or a wrong configuration is unhealthy; reduced
    bandwidth, recoveries in progress and a lost global fabric manager are degraded."""
    out: list[Finding] = []
    if summary in _FABRIC_SUMMARY:
        out.append(_FABRIC_SUMMARY[summary])
    for text, shift, level in _FABRIC_FLAGS:
        if mask >> shift & 0x3 == _MASK_TRUE:
            out.append((level, f"fabric: {text}"))
    config = mask >> _FABRIC_CONFIG_SHIFT & 0xF
    if config > 1:
        why = _FABRIC_CONFIG.get(config, f"code {config}")
        out.append(("unhealthy", f"fabric: incorrect configuration ({why})"))
    if mask >> _FABRIC_GFM_SHIFT & 0x3 == 2:
        out.append(("degraded", "fabric: global fabric manager disconnected"))
    return out


class HealthPolicy(msgspec.Struct, frozen=True):
    xids: XidTable = msgspec.field(default_factory=XidTable)
    recover_after_s: float = 60.0
    xid_hold_s: float = 300.0
    retired_pages_limit: int = 60
    # DCGM's hardware limits (dcgm_gpu_hardware_limits.h): 8 PCIe replays a minute, 100
    # NVLink CRC errors a second, more than 1 NVLink replay/recovery error.
    pcie_replays_per_min: float = 8.0
    nvlink_crc_per_s: float = 100.0
    nvlink_errors_per_min: float = 1.0


class DeviceState(msgspec.Struct, frozen=True):
    status: HealthStatus = "healthy"
    reasons: tuple[str, ...] = ()
    clear_since: float | None = None  # when the raw condition last became better
    xid_until: float = 0.0
    xid_reason: str = ""
    reset_reason: str = ""  # a reset-class XID: held until a reset is seen
    reset_status: HealthStatus = "unhealthy"
    away: bool = False  # gone (unreadable, NVML down) since the reset-class XID
    # Recent samples of each cumulative counter, for burst rates.
    baselines: Mapping[str, CounterWindow] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )


class HealthState(msgspec.Struct, frozen=True):
    devices: Mapping[str, DeviceState] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    node: NodeHealth = msgspec.field(default_factory=lambda: NodeHealth(status="healthy"))
    # XIDs no GPU could be named for: (held until, reason), kept at node level.
    orphans: tuple[tuple[float, str], ...] = ()

    def unhealthy_devices(self) -> tuple[DeviceHealth, ...]:
        """Every device that is not healthy now, for heartbeats (absent means healthy)."""
        return tuple(
            DeviceHealth(device_id=d, status=s.status, reasons=_cap(s.reasons))
            for d, s in sorted(self.devices.items())
            if s.status != "healthy"
        )


def findings(c: GpuCounters, policy: HealthPolicy) -> list[Finding]:
    """The raw conditions of one GPU right now, worst first (bursts are in `evaluate`)."""
    out: list[Finding] = []
    if c.lost:
        lost = "GPU is lost (NVML_ERROR_GPU_IS_LOST)"
        # Lost before its first good read: a stand-in, so missing (the coordinator's
        # `device.missing`), like its inventory's `GpuInfo.missing` says.
        return [("unhealthy", f"missing: {lost}" if c.uuid.startswith("missing-") else lost)]
    if c.unreadable:
        return [("unhealthy", f"missing: {c.unreadable}")]
    if c.fabric:
        out.append(("unhealthy", c.fabric))
    if c.recovery_action:
        action = _RECOVERY_ACTIONS.get(c.recovery_action, str(c.recovery_action))
        out.append(("unhealthy", f"NVML recovery action: {action}"))
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
    if c.nvswitches is not None and c.nvswitches[0] < c.nvswitches[1]:
        gone = f" (gone: {', '.join(c.nvswitches_missing)})" if c.nvswitches_missing else ""
        reached, expected = c.nvswitches
        out.append(("unhealthy", f"NVSwitch: {reached} of {expected} reached{gone}"))
    if c.nvlink_down:
        links = ",".join(str(x) for x in c.nvlink_down)
        out.append(("unhealthy", f"NVLink down: link {links}"))
    if c.fabric_health is not None:
        out += fabric_findings(*c.fabric_health)
    if c.pcie_width is not None and c.pcie_width[0] < c.pcie_width[1]:
        out.append(("degraded", f"PCIe link width x{c.pcie_width[0]} of x{c.pcie_width[1]}"))
    # Idle GPUs lower the link generation to save power; only a busy GPU is downtrained.
    if c.pcie_gen is not None and c.pcie_gen[0] < c.pcie_gen[1] and not c.idle:
        out.append(("degraded", f"PCIe link Gen{c.pcie_gen[0]} of Gen{c.pcie_gen[1]}"))
    if c.mig_pending:
        out.append(("degraded", "MIG mode change pending (GPU reset needed)"))
    if c.thermal_slowdown:
        out.append(("degraded", "thermal slowdown"))
    if c.power_slowdown:
        out.append(("degraded", "power brake slowdown"))
    if c.hw_slowdown:
        out.append(("degraded", "hardware slowdown (HW_SLOWDOWN clock event reason)"))
    if c.temperature is not None and c.temperature[0] >= c.temperature[1]:
        t, limit = c.temperature
        out.append(("degraded", f"GPU temperature {t} C at or above slowdown {limit} C"))
    if c.hbm_temperature is not None and c.hbm_temperature[0] >= c.hbm_temperature[1]:
        t, limit = c.hbm_temperature
        out.append(("degraded", f"HBM temperature {t} C at or above its maximum {limit} C"))
    if c.ecc_mode is not None and c.ecc_mode[0] != c.ecc_mode[1]:
        now, then = (_ECC.get(m, str(m)) for m in c.ecc_mode)
        out.append(("degraded", f"ECC mode change pending ({now} now, {then} after a reset)"))
    if c.inforom_corrupt:
        out.append(("degraded", "InfoROM corrupted (nvmlDeviceValidateInforom)"))
    return out


def evaluate(
    prev: HealthState,
    counters: Iterable[GpuCounters],
    xids: Iterable[XidEvent],
    now: float,
    policy: HealthPolicy,
    nvml_error: str | None = None,
    extra: Mapping[str, Sequence[Finding]] | None = None,
) -> HealthState:
    """`extra` holds the findings of devices other than GPUs (NICs, missing placeholders);
    pass every such device every time, healthy ones with no findings, so that their
    recovery goes through hysteresis too."""
    orphans = tuple(o for o in prev.orphans if now < o[0])
    extra = extra or {}
    if nvml_error is not None:
        # Nothing is known about the GPUs: keep their last states, flag the node. A reset
        # may happen meanwhile (driver reload, operator reset while NVML is released).
        kept = {
            d: msgspec.structs.replace(s, away=True) if s.reset_reason else s
            for d, s in prev.devices.items()
            if d not in extra
        }
        for device_id, found in extra.items():  # NICs and placeholders do not need NVML
            kept[device_id] = _step(
                prev.devices.get(device_id, DeviceState()), list(found), now, policy
            )
        reasons = (nvml_error, *(r for _, r in orphans))
        return HealthState(
            MappingProxyType(kept),
            NodeHealth(status="unmonitored", reasons=_cap(reasons)),
            orphans,
        )
    counters = list(counters)
    known = {c.uuid for c in counters}
    by_uuid: dict[str, list[XidEvent]] = {}
    for event in xids:
        if event.uuid in known:
            by_uuid.setdefault(event.uuid, []).append(event)
        elif policy.xids.classify(event.xid) not in ("application", "informational", "other"):
            text = f"{policy.xids.describe(event.xid)} on an unidentified GPU"
            orphans += ((event.at + policy.xid_hold_s, text),)
    devices: dict[str, DeviceState] = {}
    gpu_ids: set[str] = set()
    for c in counters:
        gpu_ids.add(c.uuid)
        old = prev.devices.get(c.uuid, DeviceState())
        held = _apply_xids(old, by_uuid.get(c.uuid, []), c, policy)
        raw = findings(c, policy)
        baselines, bursts = _bursts(held.baselines, c, now, policy)
        raw += bursts
        if held.reset_reason:
            raw.insert(0, (held.reset_status, f"{held.reset_reason}: held until a GPU reset"))
        if now < held.xid_until:
            raw.insert(0, ("unhealthy", held.xid_reason))
        devices[c.uuid] = msgspec.structs.replace(
            _step(held, raw, now, policy), baselines=baselines
        )
    for device_id, found in extra.items():
        old = prev.devices.get(device_id, DeviceState())
        devices[device_id] = _step(old, list(found), now, policy)
    orphans = tuple(o for o in orphans if now < o[0])
    return HealthState(MappingProxyType(devices), _node(devices, gpu_ids, orphans), orphans)


def _apply_xids(
    old: DeviceState, events: list[XidEvent], c: GpuCounters, policy: HealthPolicy
) -> DeviceState:
    s = old
    # A reset seen since the XID: the recovery action reads NONE, or the GPU was away and
    # is back (only trusted where the driver has no recovery action field).
    if s.reset_reason and not (c.lost or c.unreadable):
        if c.recovery_action == 0 or (c.recovery_action is None and s.away):
            s = msgspec.structs.replace(s, reset_reason="", reset_status="unhealthy", away=False)
    elif s.reset_reason:
        s = msgspec.structs.replace(s, away=True)
    for event in events:
        cls = policy.xids.classify(event.xid)
        text = policy.xids.describe(event.xid)
        if cls == "fault":
            s = msgspec.structs.replace(
                s, xid_until=max(s.xid_until, event.at + policy.xid_hold_s), xid_reason=text
            )
        elif cls in ("reset", "reset_degraded", "recovery"):
            status: HealthStatus = "degraded" if cls == "reset_degraded" else "unhealthy"
            if s.reset_reason and _RANK[s.reset_status] > _RANK[status]:
                status = s.reset_status
            s = msgspec.structs.replace(s, reset_reason=text, reset_status=status, away=False)
    return s


def _bursts(
    windows: Mapping[str, CounterWindow],
    c: GpuCounters,
    now: float,
    policy: HealthPolicy,
) -> tuple[Mapping[str, CounterWindow], list[Finding]]:
    """Counter increases over the last RATE_WINDOW_S (against the newest sample at least
    that old, else the oldest kept) above the policy's limits. A counter that went down
    (the GPU was reset) starts over."""
    limits = {
        "pcie_replay": (policy.pcie_replays_per_min, "PCIe replays"),
        "crc_flit": (policy.nvlink_crc_per_s * 60, "NVLink CRC flit errors"),
        "crc_data": (policy.nvlink_crc_per_s * 60, "NVLink CRC data errors"),
        "replay": (policy.nvlink_errors_per_min, "NVLink replay errors"),
        "recovery": (policy.nvlink_errors_per_min, "NVLink recovery errors"),
    }
    current = dict(c.nvlink_errors)
    if c.pcie_replays is not None:
        current["pcie_replay"] = c.pcie_replays
    out: list[Finding] = []
    kept: dict[str, CounterWindow] = {}
    for name, value in sorted(current.items()):
        window = windows.get(name) or CounterWindow.empty()
        kept[name], base, since = window.advance(value, now, RATE_WINDOW_S)
        per_min, label = limits[name]
        if value - base > per_min:
            out.append(("degraded", f"{label}: {value - base} in {now - since:.0f} s"))
    return MappingProxyType(kept), out


def _step(old: DeviceState, raw: list[Finding], now: float, policy: HealthPolicy) -> DeviceState:
    status: HealthStatus = "healthy"
    for level, _ in raw:
        if _RANK[level] > _RANK[status]:
            status = level
    reasons = tuple(r for _, r in raw)
    if _RANK[status] >= _RANK[old.status]:
        return msgspec.structs.replace(old, status=status, reasons=reasons, clear_since=None)
    # Better than reported: wait until it has stayed better for recover_after_s.
    since = old.clear_since if old.clear_since is not None else now
    if now - since >= policy.recover_after_s:
        return msgspec.structs.replace(old, status=status, reasons=reasons, clear_since=None)
    return msgspec.structs.replace(old, clear_since=since)


def _node(
    devices: Mapping[str, DeviceState],
    gpu_ids: set[str],
    orphans: tuple[tuple[float, str], ...] = (),
) -> NodeHealth:
    bad = {d: s for d, s in devices.items() if s.status != "healthy"}
    if not bad and not orphans:
        return NodeHealth(status="healthy")
    status: HealthStatus = "degraded"
    gpus = [s for d, s in devices.items() if d in gpu_ids]
    if gpus and all(s.status == "unhealthy" for s in gpus):
        status = "unhealthy"
    # Orphan XIDs first: no device carries them, so the cap must not drop them.
    reasons = [r for _, r in orphans] + [
        f"{d}: {s.status}: {s.reasons[0] if s.reasons else ''}" for d, s in sorted(bad.items())
    ]
    return NodeHealth(status=status, reasons=_cap(tuple(reasons)))


def _cap(reasons: tuple[str, ...]) -> tuple[str, ...]:
    """Keep heartbeats small (< 1 KiB normally) however many conditions a device has."""
    return tuple(r[:MAX_REASON_CHARS] for r in reasons[:MAX_REASONS])
