"""Planted bugs (SPEC §8 "catches a planted constraint bug"; issue 23): bugs of the
class the simulation exists for, each planted in the test process, with a fixed seed
whose search catches it within a stated number of steps (issue 29), and the search.

E, the first planted: a ledger whose snapshots forget bookings on forms a device no
longer has — claims keyed by atom id, as before issue 11. A GPU booked whole and then
re-partitioned (or a NIC whose VFs changed) looks free in its new forms, and the placer
books the same physical device twice. Nothing is patched: the broken cache is passed in
by a `Ledger` subclass, as a deployment could wire it. A to D are patched in place, so
every caller gets the broken rule.

Each plant's `steps` are measured: the search from its seed catches it at exactly that
step (the seed replays exactly), on SQLite and on PostgreSQL, well within the budget of
SEQUENCES × STEPS; a search that does not catch it within the budget fails in seconds,
with a message that names the plant, the seed and the steps tried — never by a timeout.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.domain import booking, claims, gpu_use_accrual
from coordinator.domain.gpu_use_units import Hold
from coordinator.domain.placement_model import AtomSlot, HeldClaim, PoolSnapshot
from coordinator.domain.pool_cache import PoolCache
from coordinator.domain.ports import Heap
from coordinator.ledger import Database, Ledger
from coordinator.ledger.bookings import BookingRepo
from coordinator.ledger.pool_memory import PoolMemory
from coordinator.ledger.snapshot import PoolView, SnapshotCache, SnapshotDraft
from tests.simulation.base import InvariantViolation
from tests.simulation.search import Searched, glue, options, search

# Every plant's search: at most SEQUENCES sequences of STEPS steps. The budget is part
# of what a seed means, not only a cap: hypothesis draws its first few sequences
# differently for other `max_examples`, so a seed's measured step holds for this budget.
SEQUENCES, STEPS = 10, 30


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

    def current(self, pool_id: str, versions: tuple[int, int] | None) -> PoolView | None:
        view = super().current(pool_id, versions)
        return None if view is None else _ForgetfulView(view.cache)


class PlantedLedger(Ledger):
    def __init__(self, db: Database, heap: Heap | None = None) -> None:
        super().__init__(db, heap)
        self.snapshots = ForgetfulSnapshots(heap)
        self.bookings = BookingRepo(db, self.snapshots, self._peek)


def _claims_ignore_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A: whole-device and partition claims no longer conflict (`claims.conflicts`)."""

    def conflicts(a: claims.Claim, b: claims.Claim) -> bool:
        if a.device is None or b.device is None:
            return True
        return a.device == b.device and a.part == b.part

    monkeypatch.setattr(claims.conflicts, "__code__", conflicts.__code__)


def _counts_kept_over_reloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """B: the kept free counts are no longer reset when a pool's bookings are reloaded
    (`SnapshotCache._fresh`): after a release the placer still counts the released
    capacity as taken."""
    fresh = SnapshotCache._fresh  # noqa: SLF001 — the planted bug is in it

    async def stale(
        self: SnapshotCache, conn: AsyncConnection, pool_id: str, now: int
    ) -> PoolCache:
        before = self._pools.get(pool_id)
        kept = None if before is None else (before.nodes_version, before.counts)
        cache = await fresh(self, conn, pool_id, now)
        if kept is not None and kept[1] is not None and cache.nodes_version == kept[0]:
            cache.counts = kept[1]
        return cache

    monkeypatch.setattr(SnapshotCache, "_fresh", stale)


def _components_as_cliques(monkeypatch: pytest.MonkeyPatch) -> None:
    """C: any two GPUs of a node count as NVLinked, as when a connected component is
    read as a clique: a chain of bridges 0–1–2 gives three GPUs."""
    monkeypatch.setattr(AtomSlot, "linked", lambda self, other: True)


def _never_preempts(monkeypatch: pytest.MonkeyPatch) -> None:
    """D: a regular request that fits only by preempting spot holders is refused (and
    preview offers no `preemptible`)."""

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(booking, "preempting", nothing)


def _nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """E: nothing patched; the ledger is `PlantedLedger`."""


def _draft_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """31c: a batch of creates drafts on the pool as this replica last cached it, without
    comparing the database's version counters (`SnapshotCache.draft`): a change no read
    reloaded since — a node put in maintenance or moved away, a device's new form, what
    another replica booked — is not seen by the create that follows it."""
    checked = SnapshotCache.draft

    async def unchecked(
        self: SnapshotCache, conn: AsyncConnection, pool_id: str, now: int
    ) -> SnapshotDraft:
        cached = self._pools.get(pool_id)
        if cached is None:
            return await checked(self, conn, pool_id, now)
        return SnapshotDraft(cached.fork())

    monkeypatch.setattr(SnapshotCache, "draft", unchecked)


def _use_to_next_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    """31d: a use pass credits each stretch of its window to the bookings live at the
    stretch's end (`gpu_use_accrual._stretches`): a reservation's last used time on a
    GPU goes to the next reservation on it, and a booking ending at the pass gets none."""

    def at_end(
        holders: tuple[Hold, ...], start: int, end: int
    ) -> Iterator[tuple[int, int, tuple[Hold, ...]]]:
        cuts = sorted(
            {start, end} | {t for h in holders for t in (h.start, h.end) if start < t < end}
        )
        for lo, hi in pairwise(cuts):
            present = tuple(h for h in holders if h.start <= hi < h.end)
            if present:
                yield lo, hi, present

    monkeypatch.setattr(gpu_use_accrual, "_stretches", at_end)


def _move_counts_own_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """31e: whether a pool still needs a node about to leave it counts the node's own
    memory among what the pool keeps (`PoolMemory.memory` ignores `without`): a node
    leaves a pool its interval reservations need, and their memory is promised twice."""

    def memory(self: PoolMemory, without: str | None = None) -> int:
        return sum(self.in_service.values())

    monkeypatch.setattr(PoolMemory, "memory", memory)


@dataclass(frozen=True)
class Plant:
    name: str
    install: Callable[[pytest.MonkeyPatch], None]
    caught_as: str  # what the InvariantViolation that catches it says (a regex)
    seed: int
    # Measured: the step (counted over the whole search, from 1) at which the search
    # from `seed` catches it, per database, of a budget of SEQUENCES × STEPS.
    steps: Mapping[str, int] = field(default_factory=dict)
    ledger: type[Ledger] = Ledger


PLANTS = {
    p.name: p
    for p in (
        Plant(
            "A-claims-ignore-partitions",
            _claims_ignore_partitions,
            "same physical device",
            seed=4,
            steps={"sqlite": 62, "postgresql": 62},
        ),
        Plant(
            "B-counts-kept-over-reloads",
            _counts_kept_over_reloads,
            "CAPACITY_NOT_AVAILABLE, but it fits",
            seed=1,
            steps={"sqlite": 186, "postgresql": 186},
        ),
        Plant(
            "C-components-as-cliques",
            _components_as_cliques,
            "not pairwise NVLinked",
            seed=9,
            steps={"sqlite": 162, "postgresql": 162},
        ),
        Plant(
            "D-never-preempts",
            _never_preempts,
            "but it fits by preempting spot holders",
            seed=7,
            steps={"sqlite": 74, "postgresql": 74},
        ),
        # Caught as a booking over a held device (on PostgreSQL, whose claim constraint
        # refuses it, as a 503 with no other writer), or earlier, as a preview that
        # offers what a held old form still takes and a create that refuses it.
        Plant(
            "E-forgets-old-forms",
            _nothing,
            r"same physical device|preview said",
            seed=4,
            steps={"sqlite": 62, "postgresql": 62},
            ledger=PlantedLedger,
        ),
        # Issue 31's plants: each escaped the simulation before its rules were added.
        Plant(
            "31c-draft-skips-version-check",
            _draft_unchecked,
            r"on a node that is|booked .* of pool|not a current atom|same physical|but it fits",
            seed=1,
            steps={"sqlite": 81, "postgresql": 81},
        ),
        Plant(
            "31d-use-credited-to-next-holder",
            _use_to_next_holder,
            r"credited \d+ ms of use",
            seed=8,
            steps={"sqlite": 253, "postgresql": 253},
        ),
        Plant(
            "31e-pool-move-counts-own-memory",
            _move_counts_own_memory,
            r"left .*, whose memory commitments peak",
            seed=4,
            steps={"sqlite": 85, "postgresql": 85},
        ),
    )
}


def hunt(
    plant: Plant,
    url: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    seed: int | None = None,
    sequences: int | None = None,
) -> Searched:
    """Plant `plant` and search the simulation for it from its seed (or `seed`), within
    SEQUENCES (or `sequences`) sequences, on the ledger at `url`."""
    plant.install(monkeypatch)
    with glue(url, plant.ledger) as g:
        return search(
            g, plant.seed if seed is None else seed, options(sequences or SEQUENCES, STEPS)
        )


def missed(plant: Plant, found: Searched) -> str | None:
    """None when `found` caught the plant; else why not, with the plant, the seed and
    the steps tried."""
    tried = (
        f"plant {plant.name}, seed {found.seed}: {len(found.steps)} steps tried in "
        f"{found.sequences} sequences of up to {STEPS} ({found.seconds} s)"
    )
    if found.error is None:
        return (
            f"{tried}, and not caught (measured from seed {plant.seed}: caught at step "
            f"{dict(plant.steps)})"
        )
    if not isinstance(found.error, InvariantViolation):
        return f"{tried}, ended by {type(found.error).__name__}: {found.error}"
    if not re.search(plant.caught_as, str(found.error)):
        return f"{tried}, ended by another violation than /{plant.caught_as}/: {found.error}"
    return None
