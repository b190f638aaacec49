"""Who runs on a GPU, as the use pass believes it (SPEC §10, issue 32), pure: the owner an
agent reports is what a process's environment (`GPUFLEET_RESERVATION_ID`) or cgroup
says, so whoever starts a process chooses it. Before the join, the accrual and the
metrics see it:

- a process that names a reservation is that reservation's only when the id has the
  reservation id pattern and names a live reservation (scheduled, active or noticed);
  any other is `unknown` with no owner, one owner with every other such process on
  its unit (8 rewrites of 250 processes each naming a made-up id are one owner, not
  2,000);
- a unit has at most `MAX_OWNERS_PER_UNIT` owners: its holders' own first, then no
  known owner, then other reservations, then pods, jobs, units and containers, each
  by name; any owner past the bound is taken as no known owner. A unit therefore
  costs a bounded number of foreign-use marks, alerts and metric series whatever its
  processes say.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import msgspec

from shared.ids import RESERVATION_ID_PATTERN
from shared.wire import DeviceUse, ProcessUse

MAX_OWNERS_PER_UNIT = 8
RESERVATION_ID = re.compile(RESERVATION_ID_PATTERN)
NOBODY = ("unknown", "")


def reservation_owners(uses: Mapping[str, Mapping[str, DeviceUse]]) -> set[str]:
    """The reservation ids processes name that have the pattern of one: the ones worth
    looking up (a made-up string costs no query)."""
    return {
        p.owner
        for devices in uses.values()
        for d in devices.values()
        for p in d.processes
        if p.owner_kind == "reservation" and RESERVATION_ID.match(p.owner)
    }


def vetted(
    uses: Mapping[str, Mapping[str, DeviceUse]],
    live: Collection[str],
    holders: Mapping[tuple[str, str], Collection[str]],
) -> dict[str, dict[str, DeviceUse]]:
    """`uses` with each process's owner as believed: `live` the reservation ids that are
    live now, `holders` (node, unit) → the reservations holding it."""
    return {
        node_id: {
            unit: _vet(use, live, holders.get((node_id, unit), ())) for unit, use in devices.items()
        }
        for node_id, devices in uses.items()
    }


def _vet(use: DeviceUse, live: Collection[str], holders: Collection[str]) -> DeviceUse:
    if not use.processes:
        return use

    def believed(p: ProcessUse) -> tuple[str, str]:
        if p.owner_kind == "reservation" and p.owner not in live:
            return NOBODY
        return (p.owner_kind, p.owner)

    def rank(owner: tuple[str, str]) -> tuple[int, str, str]:
        kind, name = owner
        if kind == "reservation":
            return (0 if name in holders else 2, kind, name)
        return (1 if owner == NOBODY else 3, kind, name)

    owners = sorted({believed(p) for p in use.processes}, key=rank)
    kept = set(owners[: MAX_OWNERS_PER_UNIT - 1]) | {NOBODY}
    if len(owners) <= MAX_OWNERS_PER_UNIT:
        kept = set(owners)
    changed = False
    processes = []
    for p in use.processes:
        owner = believed(p)
        if owner not in kept:
            owner = NOBODY
        if owner != (p.owner_kind, p.owner):
            # Not who it said: nor is the name it gave.
            p = msgspec.structs.replace(p, owner_kind=owner[0], owner=owner[1], owner_name="")
            changed = True
        processes.append(p)
    return msgspec.structs.replace(use, processes=tuple(processes)) if changed else use
