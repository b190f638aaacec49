"""A GPU unit, pure: what it is, who holds it and how busy it is (SPEC §10).

A device's *unit* is the UUID the agent reports use under: a whole GPU's, or a MIG
instance's (`unit_of`). A booking covers a unit when it books the GPU (`gpu`), one of its
time-slice slots (`gpu.slot`: every slot's holder shares the GPU), the MIG instance
(`gpu.mig`), or the whole node (`node`: every unit on it): `Hold`, `covers`. A unit's use
is its processes and their owners: used with no booking covering it
(`unbooked_units`), by Slurm's choice of GPU (`slurm_chosen`), at what utilization
(`utilization`), by which of several holders (`shares`), busy or not for idleness
(`busy`), and as the metrics show it (`unit_lines`). `gpu_use_join` judges it against
the bookings pass by pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.wire import IDLE_UTIL_PERCENT, DeviceUse, ProcessUse

GPU_CLASSES = frozenset({"gpu", "gpu.mig", "gpu.slot"})
COVERING_CLASSES = GPU_CLASSES | {"node"}


@dataclass(frozen=True, slots=True)
class Unit:
    """A unit on a node: its UUID, and the class of atom it is (`gpu`, `gpu.mig`, or
    `gpu.slot` for a GPU shared by time slices)."""

    node_id: str
    uuid: str
    cls: str


@dataclass(frozen=True, slots=True)
class Hold:
    """One live booking of a GPU-carrying atom: `units` are the UUIDs it covers on its
    node (one, or every unit for a whole-node booking)."""

    reservation_id: str
    tenant_id: str
    project_id: str | None
    pool_id: str
    node_id: str
    resource: str  # the atom's class: gpu, gpu.mig, gpu.slot or node
    units: tuple[str, ...]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Policy:
    idle_after_ms: int = 30 * 60_000
    idle_util_percent: int = IDLE_UTIL_PERCENT
    # Use alerts one unit may say at once, and then one per period (`gpu_use_gate`).
    unit_alert_burst: int = 4
    unit_alert_every_ms: int = 5 * 60_000


@dataclass(frozen=True, slots=True)
class UnitLine:
    """One unit as the last pass saw it (for the metrics)."""

    node_id: str
    pool_id: str
    uuid: str
    in_use: bool
    sm_util: int | None
    holders: tuple[str, ...]  # reservation ids
    users: tuple[str, ...]  # owners of its processes ("" when unknown)
    owner_kinds: tuple[str, ...]
    owner_names: tuple[str, ...]  # each process's owner's readable name ("" unknown)


def unit_of(cls: str, atom_id: str, device_id: str, attrs: Mapping[str, Any]) -> str:
    """The UUID an atom's use is reported under: a MIG instance's own (its `uuid`
    attribute, else its atom id's last part), else its GPU's."""
    if cls == "gpu.mig":
        uuid = attrs.get("uuid")
        return uuid if isinstance(uuid, str) and uuid else atom_id.rsplit(":", 1)[-1]
    return device_id


def covers(holds: Iterable[Hold]) -> dict[tuple[str, str], tuple[Hold, ...]]:
    """(node, unit) → the holds covering it."""
    out: dict[tuple[str, str], list[Hold]] = {}
    for hold in holds:
        for unit in hold.units:
            out.setdefault((hold.node_id, unit), []).append(hold)
    return {k: tuple(v) for k, v in out.items()}


def unbooked_units(
    uses: Mapping[str, Mapping[str, DeviceUse]], holds: Iterable[Hold]
) -> frozenset[tuple[str, str]]:
    """(node, unit) pairs with a process and no live booking covering them: what `join`
    marks as unbooked use, for a replica that judges nothing (the placer's `busy`)."""
    covered = covers(holds)
    return frozenset(
        (node_id, unit)
        for node_id, devices in uses.items()
        for unit, use in devices.items()
        if use.processes and (node_id, unit) not in covered
    )


def slurm_chosen(
    uses: Mapping[str, Mapping[str, DeviceUse]], holds: Iterable[Hold]
) -> dict[tuple[str, str], str]:
    """(node, unit) → reservation: units no live booking covers whose every process names
    one reservation that holds GPUs on the same node — the GPU Slurm chose for that
    booking's job inside its reservation, not the one the ledger numbered."""
    holds = list(holds)
    covered = covers(holds)
    on_node = {(h.node_id, h.reservation_id) for h in holds}
    out: dict[tuple[str, str], str] = {}
    for node_id, devices in uses.items():
        for unit, use in devices.items():
            if not use.processes or (node_id, unit) in covered:
                continue
            owners = {(p.owner_kind, p.owner) for p in use.processes}
            if len(owners) == 1:
                kind, rid = next(iter(owners))
                if kind == "reservation" and (node_id, rid) in on_node:
                    out[(node_id, unit)] = rid
    return out


def utilization(use: DeviceUse) -> int | None:
    """The unit's SM utilization: the device's, else the sum of its processes' (a MIG
    instance has no device-wide figure), capped at 100; None when nothing says."""
    if use.sm_util is not None:
        return use.sm_util
    known = [p.sm_util for p in use.processes if p.sm_util is not None]
    return min(100, sum(known)) if known else None


def _util_of(processes: Sequence[ProcessUse], use: DeviceUse) -> int | None:
    """The utilization of some of a unit's processes: the sum of theirs where each has
    a figure (capped at 100), else the unit's."""
    known = [p.sm_util for p in processes]
    if processes and all(u is not None for u in known):
        return min(100, sum(u for u in known if u is not None))
    return utilization(use)


def shares(holders: Iterable[str], use: DeviceUse) -> dict[str, tuple[float, int | None]]:
    """Who ran on a unit several reservations hold at once (time-slice or MPS slots):
    reservation → (the part of its slot's time it used, the utilization that weights
    it). A holder with a process of its own (by `GPUFLEET_RESERVATION_ID`) used all of
    it, at its own processes' utilization where each has one (else the unit's); a
    process none of the holders owns is split evenly among the holders with no process
    of their own; a holder with neither is absent (it used nothing)."""
    ids = set(holders)
    own: dict[str, list[ProcessUse]] = {}
    stray: list[ProcessUse] = []
    for p in use.processes:
        if p.owner_kind == "reservation" and p.owner in ids:
            own.setdefault(p.owner, []).append(p)
        else:
            stray.append(p)
    out = {rid: (1.0, _util_of(ps, use)) for rid, ps in own.items()}
    rest = sorted(ids - own.keys())
    if stray and rest:
        util = _util_of(stray, use)
        for rid in rest:
            out[rid] = (1 / len(rest), util)
    return out


def busy(use: DeviceUse | None, policy: Policy) -> bool | None:
    """In use, for idleness: a process, and utilization at or over the threshold. None
    (not judged) for a process with no utilization figure: neither idle nor working."""
    if use is None or not use.processes:
        return False
    util = utilization(use)
    return None if util is None else util >= policy.idle_util_percent


def first_name(names: Iterable[str]) -> str:
    """One owner's readable name from its processes' (a pod's `namespace/name`, a job's
    user, a container's name; a process may not know it): the first known one in sort
    order, so the same processes always give the same name; "" when none knows it."""
    return min(set(names) - {""}, default="")


def unit_lines(
    uses: Mapping[str, Mapping[str, DeviceUse]], holds: Sequence[Hold], pools: Mapping[str, str]
) -> tuple[UnitLine, ...]:
    """What the metrics show of each unit whose node's use is current."""
    covered = covers(holds)
    out = []
    for node_id, devices in sorted(uses.items()):
        for uuid, d in sorted(devices.items()):
            holders = tuple(sorted({h.reservation_id for h in covered.get((node_id, uuid), ())}))
            out.append(
                UnitLine(
                    node_id, pools.get(node_id, ""), uuid, bool(d.processes), d.sm_util,
                    holders, tuple(p.owner for p in d.processes),
                    tuple(p.owner_kind for p in d.processes),
                    tuple(p.owner_name for p in d.processes),
                )
            )  # fmt: skip
    return tuple(out)
