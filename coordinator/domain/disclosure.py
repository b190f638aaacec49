"""What a viewer may see of other tenants' reservations and GPU use (issue 32): the one
rule every view applies — the console's alert feed, `nodes.events`, `nodes.get` — so
that nothing shows one tenant's reservation ids, tenant id, process owners (pids, pod
UIDs, job ids), process lists, utilization or memory to another.

- An operator (viewer `None`) sees everything.
- A tenant sees its own reservations' alerts in full, and no other tenant's: a
  `reservation.*` alert whose tenant is not known is an operator's only (fail closed).
- Of a GPU unit's use it sees everything where it is the only holder; on a unit it
  shares (time-slice slots) only its own reservations' processes, their count, memory
  and utilization; on another tenant's unit only whether it is in use — what placement
  needs, beside the holder shown as `{"other": true}`; on a unit nobody holds whether it
  is in use and how many processes run there (as `gpu.unbookedUse` says), not whose.
- `gpu.foreignUse` (and its end) reaches only the tenants it concerns (a holder of the
  unit, or the tenant whose reservation the process names), naming only that tenant's
  reservations; `gpu.unbookedUse` says how many processes, not whose, its end nothing.
- A use event in a node's history (`nodes.events`) is said in general words: its
  reason, written for operators, names reservations.

`/metrics` is operator data (every unit's holders, owners and utilization) and is not
redacted: it answers only to an operator key or the metrics token (docs/operator.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from coordinator.domain.model import NodeEvent
from shared.wire import USE_KINDS, Alert, DeviceUse, ProcessUse

# The tenant asking; None: an operator, who sees everything.
Viewer = str | None

RESERVATION_KINDS = frozenset(
    {
        "reservation.notice",
        "reservation.atRisk",
        "reservation.recovered",
        "reservation.idle",
        "reservation.inUse",
    }
)

# A use event's reason in a tenant's view of a node's history.
_EVENT_REASONS = {
    "gpu.unbookedUse": "process(es) on a GPU no live booking covers",
    "gpu.foreignUse": "a process not of its holders on a booked GPU",
    "gpu.unbookedUseEnded": "no more process(es) on a GPU no live booking covers",
    "gpu.foreignUseEnded": "no more process not of its holders on a booked GPU",
}


def alert_seen(alert: Alert, viewer: Viewer) -> Alert | None:
    """`alert` as `viewer` may see it, or None when it is not theirs to see."""
    if viewer is None:
        return alert
    if alert.kind in RESERVATION_KINDS:
        return alert if alert.details.get("tenantId") == viewer else None
    if alert.kind == "gpu.unbookedUse":
        pids = alert.details.get("pids")
        count = len(pids) if isinstance(pids, list) else 0
        return msgspec.structs.replace(alert, details={"processes": count})
    if alert.kind == "gpu.unbookedUseEnded":
        return msgspec.structs.replace(alert, details={})
    if alert.kind in ("gpu.foreignUse", "gpu.foreignUseEnded"):
        return _foreign_seen(alert, viewer)
    return alert


def _foreign_seen(alert: Alert, viewer: str) -> Alert | None:
    """A stranger's process on a booked unit, as one of the tenants it concerns sees it."""
    d = alert.details
    tenant_of = d.get("holderTenants")
    holders = tenant_of if isinstance(tenant_of, dict) else {}
    mine = sorted(rid for rid, tenant in holders.items() if tenant == viewer)
    owner_kind = str(d.get("ownerKind", "unknown"))
    own_process = owner_kind == "reservation" and d.get("ownerTenantId") == viewer
    if not mine and not own_process:
        return None
    owner = str(d.get("owner", "")) if own_process else None
    who = f"reservation {owner}" if own_process else f"another owner ({owner_kind})"
    held = ", ".join(mine) if mine else "another tenant"
    details: dict[str, Any] = {
        "owner": owner,
        "ownerKind": owner_kind,
        "ownerTenantId": viewer if own_process else None,
        "holders": mine,
        "otherTenant": d.get("otherTenant"),
    }
    return msgspec.structs.replace(
        alert,
        reason=("ended: " if alert.kind == "gpu.foreignUseEnded" else "")
        + f"a process of {who} on a GPU held by {held}",
        reservation_id=alert.reservation_id if own_process else None,
        details=details,
    )


def event_seen(event: NodeEvent, viewer: Viewer) -> NodeEvent:
    """A node's recorded transition as `viewer` may see it."""
    if viewer is None or event.kind not in USE_KINDS:
        return event
    return replace(event, reason=_EVENT_REASONS.get(event.kind, "GPU use changed"))


@dataclass(frozen=True, slots=True)
class UseSeen:
    """What runs on a GPU unit, as one viewer may see it. `users`: the processes shown."""

    in_use: bool
    sm_util: int | None
    memory_used_mib: int | None
    processes: int
    users: tuple[ProcessUse, ...]


def use_seen(use: DeviceUse, holders: Mapping[str, str], viewer: Viewer) -> UseSeen:
    """A unit's use as `viewer` sees it. `holders`: reservation → tenant of the live
    bookings covering the unit now (several on a time-sliced GPU)."""
    in_use = bool(use.processes)
    everything = UseSeen(
        in_use, use.sm_util, use.memory_used_mib,
        len(use.processes) + use.processes_omitted, use.processes,
    )  # fmt: skip
    if viewer is None:
        return everything
    if not holders:  # nobody's: how busy, as `gpu.unbookedUse` says it
        return UseSeen(in_use, None, None, everything.processes, ())
    mine = {rid for rid, tenant in holders.items() if tenant == viewer}
    if not mine:
        return UseSeen(in_use, None, None, 0, ())
    if len(mine) == len(holders):
        return everything
    own = tuple(p for p in use.processes if p.owner_kind == "reservation" and p.owner in mine)
    util = _summed([p.sm_util for p in own])
    memory = _summed([p.used_memory_mib for p in own])
    return UseSeen(in_use, None if util is None else min(100, util), memory, len(own), own)


def _summed(values: Sequence[int | None]) -> int | None:
    """The sum of figures each process has, or None when any lacks one (or none ran)."""
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)
