"""A planted bug, to show the simulation catches the class of bug it exists for (SPEC §8
"catches a planted constraint bug"): a ledger whose snapshots forget bookings on forms a
device no longer has — claims keyed by atom id, as before issue 11. A GPU booked whole
and then re-partitioned (or a NIC whose VFs changed) looks free in its new forms, and
the placer books the same physical device twice. Nothing is patched: the broken cache is
passed in by a `Ledger` subclass, as a deployment could wire it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain.placement_model import HeldClaim, PoolSnapshot
from coordinator.ledger import Database, Ledger
from coordinator.ledger.bookings import BookingRepo
from coordinator.ledger.snapshot import PoolView, SnapshotCache


class _CurrentFormsOnly(Mapping[str, tuple[HeldClaim, ...]]):
    def __init__(self, held: Mapping[str, tuple[HeldClaim, ...]], current: set[str]) -> None:
        self._held, self._current = held, current

    def __getitem__(self, node_id: str) -> tuple[HeldClaim, ...]:
        return tuple(h for h in self._held[node_id] if h.atom_id in self._current)

    def get(self, node_id: str, default: Any = None) -> Any:
        return self[node_id] if node_id in self._held else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


def _forgetful(snap: PoolSnapshot) -> PoolSnapshot:
    current = {a.atom_id for n in snap.nodes for a in n.atoms}
    return replace(snap, held=_CurrentFormsOnly(snap.held, current))


class _ForgetfulView(PoolView):
    def snapshot(self, start: int, end: int) -> PoolSnapshot:
        return _forgetful(super().snapshot(start, end))


class ForgetfulSnapshots(SnapshotCache):
    """The pool as a single create and a preview see it (`view`), and as anyone else
    asks for a window of it (`snapshot`)."""

    async def snapshot(
        self,
        conn: AsyncConnection,
        pool_id: str,
        start: int,
        end: int,
        now: int,
        ignore_reservations: frozenset[str] = frozenset(),
    ) -> PoolSnapshot:
        snap = await super().snapshot(conn, pool_id, start, end, now, ignore_reservations)
        return _forgetful(snap)

    async def view(self, conn: AsyncConnection, pool_id: str, now: int) -> PoolView:
        return _ForgetfulView((await super().view(conn, pool_id, now)).cache)


class PlantedLedger(Ledger):
    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.snapshots = ForgetfulSnapshots()
        self.bookings = BookingRepo(db, self.snapshots)
