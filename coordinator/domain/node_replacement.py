"""What `nodes.replace OLD NEW` does with the old node's bookings (issue 31), pure.

An operator says NEW is the host OLD was (a renamed or reimaged host, a second agent
on it). A booking of OLD that has not ended moves to NEW when every atom its
reservation holds on OLD has its counterpart on NEW — the atom with the same id after
the node id (`OLD:gpu:GPU-1` → `NEW:gpu:GPU-1`: the same physical device, as the agent
names atoms by device) — both nodes are in one pool, and no booking NEW already has
overlaps it on that atom. Otherwise the reservation ends now (it would hold a device
NEW does not show), and the answer says which.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from coordinator.domain.claims import overlaps


@dataclass(frozen=True, slots=True)
class HeldAtom:
    """One booking of an atom that has not ended."""

    reservation_id: str
    atom_id: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Plan:
    """reservationId → {old atom id → new atom id} for the reservations that move;
    the ids of those that end."""

    moves: dict[str, dict[str, str]] = field(default_factory=dict)
    ends: tuple[str, ...] = ()


def _overlap(a: HeldAtom, b: HeldAtom) -> bool:
    return overlaps(a.start, a.end, b.start, b.end)


def counterpart(atom_id: str, old: str, new: str) -> str:
    """The atom of NEW that stands for OLD's `atom_id` (atom ids start `<nodeId>:`)."""
    return f"{new}:{atom_id.removeprefix(f'{old}:')}"


def plan(
    old: str,
    new: str,
    held: Iterable[HeldAtom],
    new_atoms: Collection[str],
    new_held: Iterable[HeldAtom],
    *,
    same_pool: bool,
    also: Iterable[str] = (),
) -> Plan:
    """Which of OLD's bookings (`held`, and the reservations `also` that hold only its
    vCPUs or memory) move to NEW (whose current atoms are `new_atoms` and whose own
    bookings are `new_held`) and which end."""
    busy: dict[str, list[HeldAtom]] = {}
    for h in new_held:
        busy.setdefault(h.atom_id, []).append(h)
    per: dict[str, list[HeldAtom]] = {rid: [] for rid in also}
    for h in held:
        per.setdefault(h.reservation_id, []).append(h)
    moves: dict[str, dict[str, str]] = {}
    ends: list[str] = []
    for rid, atoms in sorted(per.items()):
        mapped = {h.atom_id: counterpart(h.atom_id, old, new) for h in atoms}
        fits = same_pool and all(
            mapped[h.atom_id] in new_atoms
            and not any(_overlap(h, b) for b in busy.get(mapped[h.atom_id], ()))
            for h in atoms
        )
        if fits:
            moves[rid] = mapped
        else:
            ends.append(rid)
    return Plan(moves, tuple(ends))
