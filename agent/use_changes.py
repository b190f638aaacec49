"""What of the node's use goes in the next heartbeat: settled values, versions, changes.

Readings are settled first, so that noise is not a change. A utilization is sent as
read, and a new reading replaces the value last settled when it moved `UTIL_STEP`
points or crossed the idle threshold (`idle_util_percent`, the
coordinator's): the coordinator judges idleness on a value on the same side of its
threshold as the reading, always. Memory used (a device's, a process's) changes once it
has moved `MEMORY_STEP_MIB`. A process appearing or leaving, or changing owner, is
always a change. A device whose settled use has differed from its readings for
`UTIL_HOLD_S` takes the reading as it is: nothing is held stale for good. Owners' host
memory (`agent.cgroup_memory`) is part of the same state: an owner's entry changes once
its memory or its peak has moved `MEMORY_STEP_MIB` (or what the tenant rules match
changed), an owner gone is sent once as 0 MiB. Each change of the settled state is a new
`use_version`.

The agent's threshold is a setting of its own (its default the coordinator's): a
coordinator set otherwise and an agent not told still sees each crossing, at most
`UTIL_HOLD_S` late. Sending every reading raw instead would make each heartbeat of a
busy node a change, and most of them a full `UseReport`.

A heartbeat carries the devices whose settled use differs from the version the last
sent heartbeat (or `UseReport`) carried: its `use_base`. When those would make the
heartbeat larger than `HEARTBEAT_BUDGET` bytes (8 idle GPUs at start already do), the
whole state goes in a `UseReport` on its own subject instead, and the heartbeat carries
only the version. Pure: the publisher does the sending, and calls `sent` once it has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from shared.wire import IDLE_UTIL_PERCENT, DeviceUse, Heartbeat, OwnerMemory, ProcessUse

HEARTBEAT_BUDGET = 1024  # bytes: SPEC §4's "small (< 1 KiB)" heartbeat
MAX_INLINE = 64  # Heartbeat.use's bound
UTIL_STEP = 10  # percentage points
UTIL_HOLD_S = 60.0  # seconds a settled use may differ from the readings
MEMORY_STEP_MIB = 256
MemoryKey = tuple[str, str]  # an owner: (kind, id)


class UseDelta(msgspec.Struct, frozen=True):
    """The changes from version `base` to `version`, and the whole state at `version`."""

    base: int
    version: int
    devices: tuple[DeviceUse, ...]
    state: Mapping[str, DeviceUse]
    memory: tuple[OwnerMemory, ...] = ()
    memory_state: Mapping[MemoryKey, OwnerMemory] = msgspec.field(default_factory=dict)


class UsePlan(msgspec.Struct, frozen=True):
    """A heartbeat with its use fields set; `report`, when set, is to be sent first as a
    `UseReport`; `inline` is what the heartbeat brings the coordinator to once sent."""

    heartbeat: Heartbeat
    inline: UseDelta | None
    report: UseDelta | None


class UseChanges:
    def __init__(
        self, budget: int = HEARTBEAT_BUDGET, idle_util_percent: int = IDLE_UTIL_PERCENT
    ) -> None:
        self._budget = budget
        self._threshold = idle_util_percent
        self._differs_since: dict[str, float] = {}  # device -> first reading unlike it
        # Never changed in place: a UseDelta's `state` is a snapshot of one of these.
        self._current: dict[str, DeviceUse] = {}
        self._version = 0
        self._base = 0
        self._base_state: Mapping[str, DeviceUse] = {}
        self._memory: dict[MemoryKey, OwnerMemory] = {}  # never changed in place either
        self._base_memory: Mapping[MemoryKey, OwnerMemory] = {}

    @property
    def version(self) -> int:
        return self._version

    @property
    def current(self) -> tuple[DeviceUse, ...]:
        return tuple(self._current.values())

    def observe(
        self, devices: Iterable[DeviceUse], now: float, memory: Iterable[OwnerMemory] = ()
    ) -> bool:
        """Settle a reading of every device and owner's memory, taken at `now` (monotonic
        seconds); whether that made a new version."""
        new: dict[str, DeviceUse] = {}
        differs: dict[str, float] = {}
        held: dict[MemoryKey, OwnerMemory] = {}
        for raw_mem in memory:
            mkey = (raw_mem.owner_kind, raw_mem.owner)
            before = self._memory.get(mkey)
            kept = settle_memory(before, raw_mem)
            if kept is not before or kept == raw_mem:
                held[mkey] = kept
                continue
            hold_key = f"memory {mkey[0]} {mkey[1]}"
            since = self._differs_since.get(hold_key, now)
            if now - since >= UTIL_HOLD_S:
                held[mkey] = raw_mem
            else:
                held[mkey], differs[hold_key] = kept, since
        for raw in devices:
            key = raw.device_id
            prev = self._current.get(key)
            settled = settle(prev, raw, self._threshold)
            if settled != prev or settled == raw:
                new[key] = settled
                continue
            since = self._differs_since.get(key, now)
            if now - since >= UTIL_HOLD_S:
                new[key] = raw  # held long enough: the reading as it is
            else:
                new[key], differs[key] = settled, since
        self._differs_since = differs
        if new == self._current and held == self._memory:
            return False
        self._current = new
        self._memory = held
        self._version += 1
        return True

    def delta(self) -> UseDelta:
        """The devices whose use changed since the version last sent; a device no longer
        read is sent once with nothing known of it."""
        base = self._base_state
        changed = [d for key, d in self._current.items() if base.get(key) != d]
        changed += [DeviceUse(device_id=key) for key in base if key not in self._current]
        was = self._base_memory
        moved = [m for key, m in self._memory.items() if was.get(key) != m]
        moved += [
            OwnerMemory(owner_kind=m.owner_kind, owner=m.owner)  # 0 MiB: gone
            for key, m in was.items()
            if key not in self._memory
        ]
        return UseDelta(
            self._base, self._version, tuple(changed), self._current, tuple(moved), self._memory
        )

    def full(self) -> UseDelta:
        return UseDelta(
            self._version, self._version, self.current, self._current,
            tuple(self._memory.values()), self._memory,
        )  # fmt: skip

    def plan(self, heartbeat: Heartbeat) -> UsePlan:
        delta = self.delta()
        inline = msgspec.structs.replace(
            heartbeat, use=delta.devices, memory=delta.memory, use_base=delta.base,
            use_version=delta.version,
        )  # fmt: skip
        if not (delta.devices or delta.memory) or (
            len(delta.devices) <= MAX_INLINE
            and len(delta.memory) <= MAX_INLINE
            and len(inline.to_json()) <= self._budget
        ):
            return UsePlan(inline, delta, None)
        full = self.full()
        bare = msgspec.structs.replace(
            heartbeat, use=(), memory=(), use_base=full.version, use_version=full.version
        )
        return UsePlan(bare, None, full)

    def plan_without(self, heartbeat: Heartbeat) -> UsePlan:
        """A heartbeat that says nothing new of use (its report could not be sent): the
        version last sent, unchanged."""
        bare = msgspec.structs.replace(
            heartbeat, use=(), memory=(), use_base=self._base, use_version=self._base
        )
        return UsePlan(bare, None, None)

    def sent(self, delta: UseDelta) -> None:
        """`delta` reached the server: later heartbeats carry changes from its version."""
        if delta.version >= self._base:
            self._base, self._base_state = delta.version, delta.state
            self._base_memory = delta.memory_state


def settle(prev: DeviceUse | None, raw: DeviceUse, threshold: int = IDLE_UTIL_PERCENT) -> DeviceUse:
    """`raw`, with each value that moved less than its step since `prev` (and, for a
    utilization, stayed on its side of `threshold`) kept as it was."""
    before = {p.pid: p for p in prev.processes} if prev is not None else {}
    return msgspec.structs.replace(
        raw,
        sm_util=_util(prev.sm_util if prev else None, raw.sm_util, threshold),
        memory_util=_util(prev.memory_util if prev else None, raw.memory_util, threshold),
        memory_used_mib=_memory(prev.memory_used_mib if prev else None, raw.memory_used_mib),
        processes=tuple(_process(before.get(p.pid), p, threshold) for p in raw.processes),
    )


def settle_memory(prev: OwnerMemory | None, raw: OwnerMemory) -> OwnerMemory:
    """`raw` once its memory or peak moved `MEMORY_STEP_MIB` since `prev` (or what the
    tenant rules match changed), else `prev` itself."""
    if prev is None or msgspec.structs.replace(prev, current_mib=0, peak_mib=0) != (
        msgspec.structs.replace(raw, current_mib=0, peak_mib=0)
    ):
        return raw
    if abs(raw.current_mib - prev.current_mib) >= MEMORY_STEP_MIB:
        return raw
    if raw.peak_mib - prev.peak_mib >= MEMORY_STEP_MIB:
        return raw
    return prev


def _process(prev: ProcessUse | None, raw: ProcessUse, threshold: int) -> ProcessUse:
    if prev is None or (prev.owner, prev.owner_kind) != (raw.owner, raw.owner_kind):
        return raw
    return msgspec.structs.replace(
        raw,
        used_memory_mib=_memory(prev.used_memory_mib, raw.used_memory_mib),
        sm_util=_util(prev.sm_util, raw.sm_util, threshold),
    )


def _util(prev: int | None, raw: int | None, threshold: int) -> int | None:
    if prev is None or raw is None:
        return raw
    if abs(raw - prev) >= UTIL_STEP or (raw < threshold) != (prev < threshold):
        return raw
    return prev


def _memory(prev: int | None, raw: int | None) -> int | None:
    if prev is None or raw is None or abs(raw - prev) >= MEMORY_STEP_MIB:
        return raw
    return prev
