"""A coordinator's pool caches and its memory, over a real ledger: a reloaded pool's
objects are kept out of the collector's full pass, yet nothing it keeps grows without
bound — a replaced cache goes at once (no cycles), a cycle that dies while frozen is
collected by the next refresh, and closing the ledger leaves nothing frozen."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from coordinator.domain.booking import Booked, BookingRequest
from coordinator.domain.placement_model import DeviceRequest, PlacementRequest
from coordinator.domain.pool_cache import PoolCache
from coordinator.ledger import Ledger
from coordinator.runtime.heap import HeapGenerations
from coordinator.services.node_records import record_inventory
from shared.ids import new_pool_id
from shared.wire import Atom, GpuInfo, Inventory, NodeHealth, Scalars

NOW = 1_700_000_000_000
HOUR = 3_600_000
REFRESH_MS = 60_000


def inventory(pool: str, node: str) -> Inventory:
    gpus = [Atom(atom_id=f"{node}:gpu:{i}", cls="gpu", device_id=f"{node}-G{i}") for i in range(4)]
    return Inventory(
        node_id=node, pool_id=pool, boot_id="b", sent_at=0, inventory_hash=f"h-{node}",
        scalars=Scalars(vcpu=64, memory_gib=512), health=NodeHealth(status="healthy"),
        atoms=(Atom(atom_id=f"{node}:node", cls="node"), *gpus),
        gpus=tuple(
            GpuInfo(uuid=f"{node}-G{i}", index=i, name="H100", memory_mib=81559,
                    pci_bus_id=f"0000:0{i}:00.0")
            for i in range(4)
        ),
    )  # fmt: skip


class Junk:
    """A cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def no_frozen_heap() -> Iterator[None]:
    """The test starts and ends with nothing frozen and the collector on."""
    gc.unfreeze()
    yield
    gc.enable()
    gc.unfreeze()


def _caches() -> int:
    return sum(isinstance(o, PoolCache) for o in gc.get_objects())


async def _pool(ledger: Ledger) -> str:
    await ledger.tenants.create("acme", "Acme", NOW)
    pool = new_pool_id()
    await ledger.pools.create(pool, "p", "acme", None, NOW)
    await record_inventory(ledger, inventory(pool, "n0"), NOW)
    return pool


async def _preview(ledger: Ledger, pool: str, now: int) -> None:
    req = PlacementRequest(devices=(DeviceRequest("gpu", 1),))
    assert (await ledger.bookings.preview(pool, req, NOW, NOW + HOUR, now, 120_000)).placement.fits


async def _book(ledger: Ledger, pool: str, now: int) -> None:
    r = BookingRequest(
        tenant_id="acme", pool_id=pool, project_id=None,
        placement=PlacementRequest(devices=(DeviceRequest("gpu", 1),)),
        start=NOW + 2 * HOUR, duration_ms=HOUR, lease_seconds=None, resources={}, gang=None,
        notice_ms=120_000,
    )  # fmt: skip
    async with ledger.transaction() as uow:  # as a group commit writes: on a draft
        batch = await uow.booking_batch(pool, ["acme"], now)
        assert isinstance(await batch.book(r), Booked)
        await batch.write()
        await uow.commit()


async def test_a_replaced_pool_cache_goes_without_the_collector(
    database_url: str, no_frozen_heap: None
) -> None:
    ledger = await Ledger.open(database_url)
    try:
        pool = await _pool(ledger)
        await _preview(ledger, pool, NOW)
        gc.collect()
        # Caches alive now: this pool's, and any an earlier test in this process keeps.
        alive = _caches()
        gc.disable()
        # Batches of bookings (each one's draft replaces the cache once committed) and
        # reloads (a new node).
        for i in range(3):
            await _book(ledger, pool, NOW)
            await record_inventory(ledger, inventory(pool, f"n{i + 1}"), NOW)
            await _preview(ledger, pool, NOW)
        # Tracked objects not yet collected include garbage: only the live cache is left.
        assert _caches() == alive
    finally:
        gc.enable()
        await ledger.close()


async def test_a_reloaded_pool_is_frozen_and_what_dies_frozen_is_freed_by_the_refresh(
    database_url: str, no_frozen_heap: None
) -> None:
    heap = HeapGenerations(REFRESH_MS)
    ledger = await Ledger.open(database_url, heap=heap)
    try:
        pool = await _pool(ledger)
        alive = Junk()
        await _preview(ledger, pool, NOW)  # the first load: a refresh, then a freeze
        caches = [o for o in gc.get_objects() if isinstance(o, PoolCache)]
        assert caches == []  # the full pass does not walk the pool's cache...
        assert gc.get_freeze_count() > 0  # ...which is frozen
        died_frozen = weakref.ref(alive)
        del alive
        gc.collect()
        assert died_frozen() is not None  # the cost of a freeze: kept while frozen

        young = Junk()
        died_young = weakref.ref(young)
        del young
        gc.collect()
        assert died_young() is None  # a cycle made after the freeze: collected as ever

        await record_inventory(ledger, inventory(pool, "n1"), NOW + 1)
        await _preview(ledger, pool, NOW + REFRESH_MS - 1)  # a reload too soon: a freeze
        gc.collect()
        assert died_frozen() is not None
        await record_inventory(ledger, inventory(pool, "n2"), NOW + 2)
        await _preview(ledger, pool, NOW + REFRESH_MS)  # due: unfrozen, collected whole
        assert died_frozen() is None
        assert (heap.refreshes, heap.freezes) == (2, 1)
    finally:
        await ledger.close()
    assert gc.get_freeze_count() == 0  # closing the ledger froze nothing for good


def test_freezing_can_be_turned_off_and_a_negative_interval_is_refused(
    no_frozen_heap: None,
) -> None:
    off = HeapGenerations(0)
    off.reloaded(NOW)
    off.release()
    assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError, match="refresh_ms"):
        HeapGenerations(-1)
