"""Inventories recorded in batches (a fleet registering at once): one unit of work per
batch, and one refused inventory never fails its neighbours — a new node is checked
before the bulk write, a known node's change runs in its own savepoint. On SQLite and
PostgreSQL."""

from __future__ import annotations

from coordinator.domain.liveness import LivenessTracker
from coordinator.ledger import Ledger
from coordinator.services.node_records import NodeOutcome, NotRecorded, record_inventories
from coordinator.services.node_watch import NodeWatch
from shared.clock import FakeClock
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import Alert, Atom, Inventory
from tests.factories import backed, make_inventory, unchecked

NOW = 1_800_000_000_000


async def _pool(ledger: Ledger) -> str:
    await ledger.tenants.create("acme", "Acme", 1)
    pool_id = new_pool_id()
    await ledger.pools.create(pool_id, "p", "acme", None, 1)
    return pool_id


def _stealing(inv: Inventory, atom_id: str) -> Inventory:
    """`inv` with one more atom whose id another node already holds."""
    stolen = Atom(atom_id=atom_id, cls="gpu", device_id="GPU-stolen")
    return backed(unchecked(inv, atoms=(*inv.atoms, stolen)))


async def _node_ids(ledger: Ledger, pool_id: str) -> list[str]:
    page = await ledger.catalog.nodes([pool_id], None, 100)
    return [n.node_id for n in page.nodes]


async def test_one_refused_new_node_leaves_the_rest_of_its_batch_recorded(ledger: Ledger) -> None:
    pool_id = await _pool(ledger)
    first = make_inventory("n0", pool_id, gpus=2)
    await record_inventories(ledger, [first], NOW)
    batch = [
        make_inventory("n1", pool_id, gpus=2),
        _stealing(make_inventory("n2", pool_id, gpus=2), first.atoms[1].atom_id),
        make_inventory("n3", new_pool_id(), gpus=2),  # a pool the ledger lacks
        make_inventory("n4", pool_id, gpus=2),
    ]
    out = await record_inventories(ledger, batch, NOW + 1)
    assert [type(o) for o in out] == [NodeOutcome, NotRecorded, NotRecorded, NodeOutcome]
    assert isinstance(out[1], NotRecorded) and "n0" in out[1].error.message
    assert isinstance(out[2], NotRecorded) and out[2].error.code == "NOT_FOUND"
    assert [t.kind for t in out[0].transitions] == ["node.registered"]  # type: ignore[union-attr]
    assert await _node_ids(ledger, pool_id) == ["n0", "n1", "n4"]
    # The refused nodes wrote nothing, and the rollup needs no repair.
    rows = {r.resource: r for r in (await ledger.rollup([pool_id]))[pool_id]}
    assert rows["gpu"].total == 6
    assert await ledger.rebuild_all(NOW + 2) == 0


async def test_a_refused_change_to_a_known_node_is_undone_alone(ledger: Ledger) -> None:
    pool_id = await _pool(ledger)
    known = [make_inventory(f"k{i}", pool_id, gpus=2) for i in range(2)]
    await record_inventories(ledger, known, NOW)
    batch = [
        _stealing(make_inventory("k0", pool_id, gpus=2), known[1].atoms[1].atom_id),
        make_inventory("k1", pool_id, gpus=3),  # a known node that grew a GPU
        make_inventory("n1", pool_id, gpus=2),
    ]
    out = await record_inventories(ledger, batch, NOW + 1)
    assert [type(o) for o in out] == [NotRecorded, NodeOutcome, NodeOutcome]
    assert await _node_ids(ledger, pool_id) == ["k0", "k1", "n1"]
    rows = {r.resource: r for r in (await ledger.rollup([pool_id]))[pool_id]}
    assert rows["gpu"].total == 2 + 3 + 2
    assert await ledger.rebuild_all(NOW + 2) == 0


class _Sink:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def publish(self, alert: Alert) -> None:
        self.alerts.append(alert)


class _Bus:
    async def publish(self, subject: str, payload: bytes) -> None:
        pass


async def test_the_node_state_service_counts_a_refused_inventory_as_dropped(
    ledger: Ledger,
) -> None:
    pool_id = await _pool(ledger)
    drops: list[tuple[str, str]] = []
    sink = _Sink()
    tracker = LivenessTracker()
    service = NodeWatch(
        ledger, tracker, Subjects("t"), FakeClock(NOW), _Bus(), sink,
        drop=lambda reason, subject: drops.append((reason, subject)),
    )  # fmt: skip
    await service.load()
    first = make_inventory("n0", pool_id, gpus=1)
    service.on_inventory(first)
    await service.write_pending()
    for inv in (
        make_inventory("n1", pool_id, gpus=1),
        _stealing(make_inventory("n2", pool_id, gpus=1), first.atoms[1].atom_id),
        make_inventory("n3", pool_id, gpus=1),
    ):
        service.on_inventory(inv)
    await service.write_pending()
    assert drops == [("ledger_rejected", f"t.inv.{pool_id}.n2")]
    assert sorted(tracker.nodes) == ["n0", "n1", "n3"]
    assert [(a.node_id, a.kind) for a in sink.alerts] == [
        ("n0", "node.registered"),
        ("n1", "node.registered"),
        ("n3", "node.registered"),
    ]
