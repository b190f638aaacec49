"""Promise against use (SPEC §10), pure: for each GPU or MIG instance, who holds it (the
live bookings covering it) against who uses it (its processes and their owners), and
the transitions that follow.

What a unit is, which bookings cover it and how busy it is: `gpu_use_units`.

- `gpu.unbookedUse`: a unit has a process and no live booking covers it; said when it
  starts, `gpu.unbookedUseEnded` when it clears (its node judged and the unit without a
  process, or covered), said again only after that.
- `gpu.foreignUse`: a process on a unit live bookings cover is not one of theirs: it
  names another reservation (`GPUFLEET_RESERVATION_ID`), or none — its owner is a pod,
  a Slurm job, a container or a systemd unit (from its cgroup), or unknown. Said once
  per (unit, owner kind, owner) while it lasts, `gpu.foreignUseEnded` when it ends:
  every process with no known owner on a unit is one owner. Its details name the
  owner and its kind, and for a reservation whether it is another tenant's. A holder's
  process is known by its environment only: a Slurm job in the bridge's reservation for
  a booking is that booking's (the agent reads `GPUFLEET_RESERVATION_ID`, which the
  TaskProlog exports, else the booking the job's `SLURM_JOB_RESERVATION` names; from a
  cgroup alone it knows only a job id).
- *Slurm's choice*: inside a booking's Slurm reservation Slurm picks which of the node's
  GPUs a job gets (the counts hold, not the ledger's indexes), so a unit no booking
  covers whose processes all name one reservation holding GPUs on that node is that
  booking's (`slurm_chosen`): no `gpu.unbookedUse`, and its use counts toward the
  booking's idleness. It still counts as busy for placement (`JoinState.chosen`).
- `reservation.idle`: every unit a live reservation holds has had no process, or
  utilization under the threshold, for `idle_after_ms` (on a unit several reservations
  hold at once, its own processes: another slot holder's work is not its own);
  `reservation.inUse` when that ends, or when the reservation ends while idle
  (`details.ended`). A reservation is judged only while every node it holds GPUs on
  reports use, and only while each of its units either has no process or has a
  utilization figure: a process on a unit with no figure (a MIG instance: NVML has
  none for it) makes its idleness *not judged* (neither idle nor working: no idle clock
  runs, and an idle said is taken back with `details.notJudged`), never "working" and
  never "0 %".

`JoinState` is what the previous pass saw; `join` returns the next one and the
transitions between them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.domain.gpu_use_units import (
    Hold,
    Policy,
    busy,
    covers,
    first_name,
    shares,
    slurm_chosen,
)
from shared.wire import AlertKind, DeviceUse


@dataclass(frozen=True, slots=True)
class UseTransition:
    kind: AlertKind
    pool_id: str
    node_id: str
    reason: str
    device_id: str | None = None
    reservation_id: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Idle:
    since: int | None  # every unit idle since then (None: in use now)
    said: bool  # `reservation.idle` went out and `reservation.inUse` has not
    pool_id: str = ""  # where its alerts go (its pool, its first node)
    node_id: str = ""
    judged: bool = True  # False: a unit of it runs a process with no utilization figure
    tenant_id: str = ""  # whose: its alerts, the end included, name it


@dataclass(frozen=True, slots=True)
class JoinState:
    unbooked: frozenset[tuple[str, str]] = frozenset()  # (node, unit) with unbooked use
    # (node, unit, owner kind, owner) said
    foreign: frozenset[tuple[str, str, str, str]] = frozenset()
    idle: Mapping[str, Idle] = field(default_factory=dict)  # by reservation id
    # (node, unit) no booking covers that a booking's own processes use (Slurm's choice)
    chosen: frozenset[tuple[str, str]] = frozenset()


def _strangers(use: DeviceUse, holders: Collection[str]) -> list[tuple[str, str]]:
    """The (owner kind, owner) of a unit's processes that none of its holders owns."""
    return sorted(
        {
            (p.owner_kind, p.owner)
            for p in use.processes
            if not (p.owner_kind == "reservation" and p.owner in holders)
        }
    )


def _foreign_use(
    use: DeviceUse,
    kind: str,
    owner: str,
    holders: Sequence[Hold],
    tenant_of: Mapping[str, str],
) -> tuple[str, str | None, dict[str, Any]]:
    """The reason, the reservation named and the details of one stranger's use."""
    ids = sorted({h.reservation_id for h in holders})
    holder_tenants = sorted({h.tenant_id for h in holders})
    is_reservation = kind == "reservation"
    owner_tenant = tenant_of.get(owner) if is_reservation else None
    if is_reservation:
        who = f"reservation {owner}"
    elif kind == "unknown" or not owner:
        who = "no known owner"
    else:
        who = f"{kind} {owner}"
    details: dict[str, Any] = {
        "owner": owner,
        "ownerKind": kind,
        "ownerTenantId": owner_tenant,
        "holders": ids,
        "holderTenantIds": holder_tenants,
        # Which holder is whose: each tenant is shown only its own (`domain.disclosure`).
        "holderTenants": {h.reservation_id: h.tenant_id for h in holders},
        # Known only for a reservation: a pod's or a job's tenant is not ours to say.
        "otherTenant": (owner_tenant is not None and owner_tenant not in holder_tenants)
        if is_reservation
        else None,
        "pids": [p.pid for p in use.processes if (p.owner_kind, p.owner) == (kind, owner)],
    }
    name = first_name(
        p.owner_name for p in use.processes if (p.owner_kind, p.owner) == (kind, owner)
    )
    if name:
        details["ownerName"] = name  # a pod's namespace/name, a job's user
    reason = f"a process of {who} on a GPU held by {', '.join(ids)}"
    return reason, owner if is_reservation else None, details


def join(
    state: JoinState,
    uses: Mapping[str, Mapping[str, DeviceUse]],
    holds: Sequence[Hold],
    pools: Mapping[str, str],
    now: int,
    policy: Policy,
    tenant_of: Mapping[str, str] | None = None,
    spread: Mapping[str, frozenset[str]] | None = None,
) -> tuple[JoinState, list[UseTransition]]:
    """One pass. `uses`: node → unit → its use, for the nodes whose use is current (a
    node absent here is not judged: its marks and idle clocks stay as they were).
    `holds`: the live bookings now. `pools`: node → pool. `tenant_of`: reservation →
    tenant, for the owners processes name (to say whether a foreign one is another
    tenant's)."""
    tenant_of = tenant_of or {}
    covered = covers(holds)
    by_slurm = slurm_chosen(uses, holds)
    out: list[UseTransition] = []
    unbooked: set[tuple[str, str]] = set()
    chosen: set[tuple[str, str]] = set()
    foreign: set[tuple[str, str, str, str]] = set()
    for node_id, devices in sorted(uses.items()):
        pool_id = pools.get(node_id, "")
        for unit, use in sorted(devices.items()):
            key = (node_id, unit)
            if not use.processes:
                continue
            holders = covered.get(key, ())
            pids = [p.pid for p in use.processes]
            if key in by_slurm:
                chosen.add(key)
                continue
            if not holders:
                unbooked.add(key)
                if key not in state.unbooked:
                    out.append(
                        UseTransition(
                            "gpu.unbookedUse", pool_id, node_id,
                            f"{len(pids)} process(es) on a GPU no live booking covers",
                            device_id=unit,
                            details={"pids": pids, "owners": _owner_list(use)},
                        )
                    )  # fmt: skip
                continue
            ids = {h.reservation_id for h in holders}
            for kind, owner in _strangers(use, ids):
                mark = (node_id, unit, kind, owner)
                foreign.add(mark)
                if mark in state.foreign:
                    continue
                reason, rid, details = _foreign_use(use, kind, owner, holders, tenant_of)
                out.append(
                    UseTransition(
                        "gpu.foreignUse", pool_id, node_id, reason,
                        device_id=unit, reservation_id=rid, details=details,
                    )
                )  # fmt: skip
    # Marks of nodes not judged this pass stay as they were; a judged node's marks that
    # no longer hold end (a condition, not an event: its end is said once, like it).
    judged = set(uses)
    for node_id, unit in sorted(state.unbooked - unbooked):
        if node_id in judged:
            out.append(
                UseTransition(
                    "gpu.unbookedUseEnded", pools.get(node_id, ""), node_id,
                    "no process on the GPU any more, or a live booking covers it now",
                    device_id=unit,
                )
            )  # fmt: skip
    for node_id, unit, kind, owner in sorted(state.foreign - foreign):
        if node_id in judged:
            out.append(_foreign_end(node_id, unit, kind, owner, pools, covered, tenant_of))
    unbooked |= {k for k in state.unbooked if k[0] not in judged}
    foreign |= {k for k in state.foreign if k[0] not in judged}
    chosen |= {k for k in state.chosen if k[0] not in judged}
    idle, said = _idleness(state, uses, holds, now, policy, spread or {}, by_slurm)
    out.extend(said)
    return JoinState(frozenset(unbooked), frozenset(foreign), idle, frozenset(chosen)), out


def _foreign_end(
    node_id: str,
    unit: str,
    kind: str,
    owner: str,
    pools: Mapping[str, str],
    covered: Mapping[tuple[str, str], tuple[Hold, ...]],
    tenant_of: Mapping[str, str],
) -> UseTransition:
    """The end of one stranger's use of a unit: the same owner (and so the same
    Alertmanager labels) as its start; the unit's holders now, for who may see it."""
    holders = covered.get((node_id, unit), ())
    is_reservation = kind == "reservation"
    details: dict[str, Any] = {
        "owner": owner,
        "ownerKind": kind,
        "ownerTenantId": tenant_of.get(owner) if is_reservation else None,
        "holders": sorted({h.reservation_id for h in holders}),
        "holderTenantIds": sorted({h.tenant_id for h in holders}),
        "holderTenants": {h.reservation_id: h.tenant_id for h in holders},
    }
    return UseTransition(
        "gpu.foreignUseEnded", pools.get(node_id, ""), node_id,
        "the process no longer runs on the GPU, or its holders changed",
        device_id=unit, reservation_id=owner if is_reservation else None, details=details,
    )  # fmt: skip


def _owner_list(use: DeviceUse) -> list[dict[str, Any]]:
    return [
        {"pid": p.pid, "owner": p.owner, "ownerKind": p.owner_kind}
        | ({"ownerName": p.owner_name} if p.owner_name else {})
        for p in use.processes
    ]


def _busy_for(
    rid: str,
    node_id: str,
    unit: str,
    uses: Mapping[str, Mapping[str, DeviceUse]],
    covered: Mapping[tuple[str, str], tuple[Hold, ...]],
    policy: Policy,
) -> bool | None:
    """`busy` for one holder of a unit: on a unit several reservations hold at once,
    by what it ran there (`shares`), not by what the others did."""
    use = uses[node_id].get(unit)
    ids = {h.reservation_id for h in covered.get((node_id, unit), ())}
    if use is None or len(ids) <= 1:
        return busy(use, policy)
    share = shares(ids, use).get(rid)
    if share is None:
        return False
    return None if share[1] is None else share[1] >= policy.idle_util_percent


def _idleness(
    state: JoinState,
    uses: Mapping[str, Mapping[str, DeviceUse]],
    holds: Sequence[Hold],
    now: int,
    policy: Policy,
    spread: Mapping[str, frozenset[str]],
    by_slurm: Mapping[tuple[str, str], str],
) -> tuple[dict[str, Idle], list[UseTransition]]:
    by_reservation: dict[str, list[Hold]] = {}
    for hold in holds:
        if hold.start <= now < hold.end and hold.units:
            by_reservation.setdefault(hold.reservation_id, []).append(hold)
    covered = covers(h for hs in by_reservation.values() for h in hs)
    idle: dict[str, Idle] = {}
    out: list[UseTransition] = []
    for rid, rholds in sorted(by_reservation.items()):
        before = state.idle.get(rid, Idle(None, False))
        nodes = sorted({h.node_id for h in rholds} | spread.get(rid, frozenset()))
        if any(n not in uses for n in nodes):
            idle[rid] = before  # not judged: a node's use is not current
            continue
        states = {
            _busy_for(rid, h.node_id, u, uses, covered, policy) for h in rholds for u in h.units
        }
        states |= {busy(uses[n].get(u), policy) for (n, u), r in by_slurm.items() if r == rid}
        first = rholds[0]
        base = {
            "tenantId": first.tenant_id,
            "nodes": nodes,
            "thresholdPercent": policy.idle_util_percent,
        }
        if True in states or None in states:
            judged = True in states
            idle[rid] = Idle(None, False, first.pool_id, nodes[0], judged, first.tenant_id)
            if before.said:
                reason = (
                    "its GPUs are in use again" if judged else
                    "a process runs on a GPU with no utilization figure: idleness not judged"
                )  # fmt: skip
                out.append(
                    UseTransition(
                        "reservation.inUse", first.pool_id, nodes[0], reason,
                        reservation_id=rid,
                        details=base
                        | {"idleSince": before.since}
                        | ({} if judged else {"notJudged": True}),
                    )
                )  # fmt: skip
            continue
        since = before.since if before.since is not None else now
        say = not before.said and now - since >= policy.idle_after_ms
        idle[rid] = Idle(
            since, before.said or say, first.pool_id, nodes[0], tenant_id=first.tenant_id
        )
        if say:
            out.append(
                UseTransition(
                    "reservation.idle", first.pool_id, nodes[0],
                    f"no process, or utilization under {policy.idle_util_percent}%, on any of"
                    f" its GPUs for {(now - since) // 60_000} min",
                    reservation_id=rid, details=base | {"idleSince": since},
                )
            )  # fmt: skip
    for rid, before in sorted(state.idle.items()):
        if rid in by_reservation:
            continue
        if rid in spread:
            idle[rid] = before  # live, on nodes not judged this pass
        elif before.said:
            # Ended while idle: its idleness clears with it (a subscriber holding the
            # idle condition open hears that it is over).
            out.append(
                UseTransition(
                    "reservation.inUse", before.pool_id, before.node_id,
                    "the reservation ended", reservation_id=rid,
                    details={
                        "tenantId": before.tenant_id, "idleSince": before.since, "ended": True
                    },
                )
            )  # fmt: skip
    return idle, out
