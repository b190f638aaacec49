"""Physical identity is fleet-wide (issue 31), on SQLite and PostgreSQL: a GPU, MIG
instance or disk that another node holds (live, or with a booking not ended) is never
offered twice. The same host's inventory under a second node id (a renamed or reimaged
host, a second agent on it) is held in provisioning with the reason and an alert that
names both nodes, until an operator says which node is real."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from coordinator.app import running_coordinator
from coordinator.domain.claims import Claim, claim_rows, form_of, merged_rows
from coordinator.domain.errors import InvalidInput, NotFound
from coordinator.domain.placer import DUPLICATE_DEVICES
from coordinator.ledger import Database, Ledger
from coordinator.ledger.device_claims import insert_claims
from coordinator.services.node_records import (
    hold_duplicates,
    record_heartbeat,
    record_inventories,
    record_inventory,
    record_reachability,
    replace_node,
)
from coordinator.services.reservations import Created, Refused
from shared.clock import FakeClock
from shared.wire import Alert, Atom, Inventory
from tests.factories import backed, make_heartbeat, make_inventory, renamed
from tests.integration.conftest import Served, coordinator_settings
from tests.integration.coordinator.services.duplicate_hosts import (
    as_upgraded,
    hold_reason,
    registered_twice_at_once,
)
from tests.rig import Rig


async def test_one_gpu_under_two_node_ids_is_offered_once(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = make_inventory("a", pool, gpus=8)
    await record_inventory(ledger, a, now)
    first = await rig.reservations.create(rig.request(pool, "k1", gpus=8))
    assert isinstance(first, Created)

    changes = await record_inventory(ledger, renamed(a, "b"), now)

    reason = await hold_reason(ledger, "b")
    assert "node a" in reason and "GPU-a-0" in reason
    (alert,) = [x for x in changes.alerts if x.kind == "node.duplicateDevice"]
    assert alert.node_id == "b" and alert.details["otherNodeIds"] == ["a"]
    assert "GPU-a-0" in alert.details["devices"] and "node a" in alert.reason
    assert ("node.provisioning", reason) in [(t.kind, t.reason) for t in changes.transitions]
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocatable, gpu.provisioning, gpu.available) == (8, 8, 0)
    second = await rig.reservations.create(rig.request(pool, "k2", gpus=8))
    assert isinstance(second, Refused)
    # Neither the agent saying it is provisioned nor its next inventory lets it go.
    await record_heartbeat(ledger, make_heartbeat(renamed(a, "b"), seq=2), now)
    await record_inventory(ledger, renamed(a, "b", sent_at=5), now)
    assert await hold_reason(ledger, "b") == reason
    assert isinstance(await rig.reservations.create(rig.request(pool, "k3")), Refused)
    assert await hold_reason(ledger, "a") == ""
    assert await ledger.rebuild_all(now) == 0


async def test_a_batch_holds_a_second_id_and_every_kind_of_device(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    host = make_inventory("a", pool, gpus=0, mig=2, disks=1)
    serial = Atom(atom_id="a:disk:x", cls="disk", device_id="serial:S123")
    host = backed(renamed(host, "a", atoms=(*(a for a in host.atoms if a.cls != "disk"), serial)))
    await record_inventories(ledger, [host], now)
    # Only its disk: a disk serial is one device wherever it shows.
    c = renamed(host, "c")
    disk_only = backed(
        renamed(c, "c", atoms=tuple(a for a in c.atoms if a.cls in ("node", "disk")))
    )

    # Two new ids of the same host in one batch, and one with its disk only.
    out = await record_inventories(ledger, [renamed(host, "b"), renamed(host, "b2"), disk_only],
                                   now)  # fmt: skip

    assert all(not hasattr(o, "error") for o in out)
    for node_id in ("b", "b2", "c"):
        assert "node a" in await hold_reason(ledger, node_id), node_id
    assert "MIG-a-0" in await hold_reason(ledger, "b")
    assert "serial:S123" in await hold_reason(ledger, "c")
    assert await hold_reason(ledger, "a") == ""
    assert await ledger.rebuild_all(now) == 0


async def test_identities_that_repeat_on_every_host_are_not_compared(ledger: Ledger) -> None:
    """NIC PCI addresses and disk paths name a slot, not a device: identical hosts share
    them, and neither is held for it."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()

    def host(node_id: str) -> Inventory:
        inv = make_inventory(node_id, pool, gpus=1, nics=2)
        disk = Atom(atom_id=f"{node_id}:disk:p", cls="disk", device_id="path:0000:3b:00.0/nvme0n1")
        return backed(renamed(inv, node_id, atoms=(*inv.atoms, disk)))

    await record_inventories(ledger, [host("x"), host("y")], now)

    assert await hold_reason(ledger, "x") == "" and await hold_reason(ledger, "y") == ""


async def test_a_dead_unbooked_holder_gives_its_devices_up(ledger: Ledger) -> None:
    """A reimaged host that comes back under a new id: the old id is unreachable and
    holds no booking, so the new one is offered at once."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = make_inventory("a", pool, gpus=8)
    await record_inventory(ledger, a, now)
    await record_reachability(ledger, ["a"], False, now)

    await record_inventory(ledger, renamed(a, "b"), now)

    assert await hold_reason(ledger, "b") == ""
    assert isinstance(await rig.reservations.create(rig.request(pool, "k", gpus=8)), Created)
    # The old id coming back now collides with the new one, which is live: back by a
    # heartbeat alone (no inventory yet), it shows GPUs it no longer holds and is held
    # for them; its inventory keeps it held.
    await record_reachability(ledger, ["a"], True, now)
    assert "node b" in await hold_reason(ledger, "a")
    again = await rig.reservations.create(rig.request(pool, "k2", gpus=8))
    assert isinstance(again, Refused)
    await record_inventory(ledger, renamed(a, "a", sent_at=9), now)
    assert "node b" in await hold_reason(ledger, "a")
    assert (await rig.row(pool, "gpu")).allocatable == 8


HELD_BY_B = "duplicateDevice: GPU-a-0, GPU-a-1, GPU-a-2 and 5 more held by node b"


def _duplicate_alerts(alerts: Sequence[Alert]) -> list[Alert]:
    return [x for x in alerts if x.kind == "node.duplicateDevice"]


async def test_an_old_id_back_by_heartbeat_alone_is_held_with_its_reason_and_alert(
    ledger: Ledger,
) -> None:
    """The old id of a reimaged host comes back by heartbeat alone (no inventory) after
    a new id took its devices: it is held as an inventory's collision holds a node, its
    reason saying which node holds what, and one alert names both nodes (before: counted
    held, but no reason on the node and no alert)."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = make_inventory("a", pool, gpus=8)
    await record_inventory(ledger, a, now)
    await record_reachability(ledger, ["a"], False, now)
    await record_inventory(ledger, renamed(a, "b"), now)

    (back,) = await record_reachability(ledger, ["a"], True, now)

    assert await hold_reason(ledger, "a") == HELD_BY_B
    (alert,) = _duplicate_alerts(back.alerts)
    assert (alert.node_id, alert.details["otherNodeIds"]) == ("a", ["b"])
    assert alert.details["devices"] == [f"GPU-a-{i}" for i in range(8)]
    assert ("node.provisioning", HELD_BY_B) in [(t.kind, t.reason) for t in back.transitions]
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocatable, gpu.provisioning) == (8, 8)
    # Said once: its next change and its inventory keep the hold without a new alert.
    again = await record_reachability(ledger, ["a"], False, now)
    assert not _duplicate_alerts([x for o in again for x in o.alerts])
    later = await record_inventory(ledger, renamed(a, "a", sent_at=9), now)
    assert not _duplicate_alerts(later.alerts)
    assert await hold_reason(ledger, "a") == HELD_BY_B
    assert await hold_reason(ledger, "b") == ""
    assert await ledger.rebuild_all(now) == 0


async def test_an_upgraded_ledger_holds_the_id_that_lost_its_devices_when_it_starts(
    database_url: str, nats_url: str, clock: FakeClock
) -> None:
    """A ledger upgraded while two ids of one host were registered (revision 0008 gives
    each device to the lowest node id and holds nobody): the coordinator's start holds
    the other id with the reason, one alert naming both nodes and a node event, before
    it serves the rollup (before: counted held, nothing said)."""
    ledger = await Ledger.open(database_url)
    try:
        rig = await Rig.open(ledger)
        pool = await rig.pool(nodes=0)
        now = rig.clock.now_ms()
        b = make_inventory("b", pool, gpus=8)
        await record_inventory(ledger, b, now)
        await record_inventory(ledger, renamed(b, "c"), now)
        # Nothing was said of it before the upgrade.
        await as_upgraded(
            database_url,
            "DELETE FROM alert_outbox",
            "DELETE FROM node_events WHERE kind = 'node.duplicateDevice'",
        )
        await ledger.rebuild_all(now)
    finally:
        await ledger.close()

    async with running_coordinator(coordinator_settings(database_url, nats_url), clock) as c:
        node = await c.ledger.catalog.node("c")
        assert node is not None and node.state.provisioning
        assert node.duplicate_hold == (
            "duplicateDevice: GPU-b-0, GPU-b-1, GPU-b-2 and 5 more held by node b"
        )
        gpu = {r.resource: r for r in (await c.ledger.rollup([pool]))[pool]}["gpu"]
        assert (gpu.allocatable, gpu.provisioning) == (8, 8)
        events = [e.kind for e in await c.ledger.catalog.events("c")]
        assert events.count("node.duplicateDevice") == 1
        assert (await c.ledger.catalog.node("b")).duplicate_hold == ""  # type: ignore[union-attr]
    db = Database(database_url)
    try:
        async with db.read() as conn:
            payloads = (await conn.execute(text("SELECT payload FROM alert_outbox"))).scalars()
            (alert,) = _duplicate_alerts([Alert.from_json(p) for p in payloads])
    finally:
        await db.dispose()
    assert (alert.node_id, alert.details["otherNodeIds"]) == ("c", ["b"])
    # A second start finds nothing more to say.
    async with running_coordinator(coordinator_settings(database_url, nats_url), clock) as c:
        events = [e.kind for e in await c.ledger.catalog.events("c")]
        assert events.count("node.duplicateDevice") == 1


async def test_two_replicas_registering_one_host_under_two_ids_offer_it_once(
    ledger: Ledger, database_url: str
) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    hosts = [make_inventory(f"h{k}", pool, gpus=4) for k in range(6)]
    await registered_twice_at_once(ledger, database_url, hosts, now)
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocatable, gpu.provisioning) == (24, 24)
    assert await ledger.rebuild_all(now) == 0


async def test_replace_moves_the_old_nodes_bookings_and_lets_the_new_one_go(
    ledger: Ledger,
) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = make_inventory("a", pool, gpus=8)
    await record_inventory(ledger, a, now)
    booked = await rig.reservations.create(rig.request(pool, "k1", gpus=8))
    assert isinstance(booked, Created)
    rid = booked.reservation.reservation_id
    await record_inventory(ledger, renamed(a, "b"), now)

    done = await replace_node(ledger, "a", "b", "acme/k1", now)

    assert (done.moved, done.ended) == ((rid,), ())
    assert await hold_reason(ledger, "b") == ""
    assert await hold_reason(ledger, "a") == "replaced by node b"
    assert [t.kind for t in done.new.transitions] == ["node.provisioned"]
    assert [(t.kind, t.reason) for t in done.old.transitions] == [
        ("node.replaced", "replaced by node b"),
        ("node.provisioning", "replaced by node b"),
    ]
    (alert,) = [x for x in done.old.alerts if x.kind == "node.replaced"]
    assert alert.details == {"newNodeId": "b", "moved": [rid], "ended": []}
    moved = await ledger.reservations.get(rid, None)
    assert {x.node_id for x in moved.atoms} == {"b"}
    assert sorted(x.atom_id for x in moved.atoms) == sorted(f"b:gpu:GPU-a-{i}" for i in range(8))
    gpu = await rig.row(pool, "gpu")
    # The retired node's GPUs leave the totals: 8 physical GPUs, 8 GPUs counted.
    assert (gpu.total, gpu.allocatable, gpu.provisioning, gpu.available) == (8, 8, 0, 0)
    # The moved booking holds the kept node's GPUs: nothing more fits in its window.
    assert isinstance(await rig.reservations.create(rig.request(pool, "k2")), Refused)
    # The retired node's agent publishing again stays held, as replaced.
    await record_inventory(ledger, renamed(a, "a", sent_at=7), now)
    assert await hold_reason(ledger, "a") == "replaced by node b"
    assert await ledger.rebuild_all(now) == 0


async def test_replacing_the_newcomer_keeps_the_old_node(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = make_inventory("a", pool, gpus=8)
    await record_inventory(ledger, a, now)
    await record_inventory(ledger, renamed(a, "b"), now)

    done = await replace_node(ledger, "b", "a", "acme/k1", now)

    assert (done.moved, done.ended, done.new.transitions) == ((), (), ())
    assert await hold_reason(ledger, "a") == ""
    assert await hold_reason(ledger, "b") == "replaced by node a"
    assert isinstance(await rig.reservations.create(rig.request(pool, "k", gpus=8)), Created)


async def test_replace_ends_bookings_of_devices_the_new_node_does_not_show(
    ledger: Ledger,
) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = make_inventory("a", pool, gpus=8)
    await record_inventory(ledger, a, now)
    booked = await rig.reservations.create(rig.request(pool, "k1", gpus=8))
    assert isinstance(booked, Created)
    half = renamed(
        a, "b", atoms=tuple(x for x in renamed(a, "b").atoms if "GPU-a-7" not in x.atom_id)
    )
    await record_inventory(ledger, backed(half), now)

    done = await replace_node(ledger, "a", "b", "acme/k1", now)

    rid = booked.reservation.reservation_id
    assert (done.moved, done.ended) == ((), (rid,))
    ended = await ledger.reservations.get(rid, None)
    assert ended.state(now) == "preempted"
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocatable, gpu.available) == (7, 7)
    assert isinstance(await rig.reservations.create(rig.request(pool, "k2", gpus=7)), Created)
    assert await ledger.rebuild_all(now) == 0


async def test_replace_refuses_one_node_twice_and_unknown_nodes(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=1)
    (node,) = [n.node_id for n in (await ledger.catalog.nodes([pool], None, 10)).nodes]
    with pytest.raises(InvalidInput):
        await replace_node(ledger, node, node, "ops", rig.clock.now_ms())
    with pytest.raises(NotFound):
        await replace_node(ledger, node, "nope", "ops", rig.clock.now_ms())
    assert await hold_reason(ledger, node) == ""


async def test_operators_see_the_hold_and_replace_over_http(served: Served) -> None:
    api, ledger = served.api, served.ledger
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    tenant = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    a = make_inventory("a", pool, gpus=2)
    await record_inventory(ledger, a, 1)
    await record_inventory(ledger, renamed(a, "b"), 1)

    node = await api.ok("nodes.get", {"nodeId": "b"})
    assert node["status"] == "provisioning"
    assert node["state"]["provisioning"]["reason"] == (
        "duplicateDevice: GPU-a-0, GPU-a-1 held by node a"
    )
    body = {"oldNodeId": "b", "newNodeId": "a"}
    status, err = await api.call("nodes.replace", body, tenant)
    assert (status, err["error"]["code"]) == (403, "PERMISSION_DENIED")
    status, err = await api.call("nodes.replace", {"oldNodeId": "a", "newNodeId": "a"})
    assert (status, err["error"]["code"]) == (400, "INVALID_INPUT")
    status, err = await api.call("nodes.replace", {"oldNodeId": "b", "newNodeId": "nope"})
    assert (status, err["error"]["code"]) == (404, "NOT_FOUND")
    assert await api.ok("nodes.replace", body) == {
        "oldNodeId": "b", "newNodeId": "a", "status": "ready", "moved": [], "ended": [],
    }  # fmt: skip
    node = await api.ok("nodes.get", {"nodeId": "b"})
    assert node["state"]["provisioning"] == {"value": True, "reason": "replaced by node a"}
    events = await api.ok("nodes.events", {"nodeId": "b"})
    assert [(e["kind"], e["by"]) for e in events["events"]] == [
        ("node.registered", "coordinator"),
        ("node.provisioning", "coordinator"),
        ("node.duplicateDevice", "coordinator"),
        ("node.replaced", events["events"][-1]["by"]),
    ]
    assert events["events"][-1]["by"].startswith("operator/")
    assert events["events"][-1]["reason"] == "replaced by node a"


async def test_claims_compare_physical_devices_across_node_ids(database_url: str) -> None:
    """Defence in depth behind the hold: whatever wrote them, two claims on one GPU
    UUID (or disk serial) under two node ids for overlapping time are refused by the
    database, on both backends; NIC addresses, which repeat on every host, are not."""
    db = Database(database_url)
    await db.migrate()
    gpu = Claim("GPU-a-0")

    async def write(
        rid: str, node_id: str, c: Claim, start: int = 0, end: int = 10, form_node: str = ""
    ) -> None:
        form = form_of([f"{form_node or node_id}:gpu:{c.device}"])
        async with db.transaction() as conn:
            rows = merged_rows(claim_rows(c, form))
            await insert_claims(conn, rid, start, end, {node_id: rows})

    try:
        await write("r1", "a", gpu)
        with pytest.raises(IntegrityError):
            await write("r2", "b", gpu, 5, 15)
        with pytest.raises(IntegrityError):  # the node differs, whatever the form says
            await write("r2", "b", gpu, 5, 15, form_node="a")
        with pytest.raises(IntegrityError):
            await write("r2", "b", Claim("GPU-a-0", "b:gpu.mig:MIG-1"), 5, 15)
        await write("r3", "b", gpu, 10, 20)  # after it: fine
        await write("r4", "a", Claim("serial:S1"))
        with pytest.raises(IntegrityError):
            await write("r5", "b", Claim("serial:S1"))
        await write("r6", "a", Claim("0000:17:00.0"))
        await write("r7", "b", Claim("0000:17:00.0"))
        async with db.read() as conn:
            rids = await conn.execute(text("SELECT DISTINCT reservation_id FROM device_claims"))
            assert sorted(rids.scalars()) == ["r1", "r3", "r4", "r6", "r7"]
    finally:
        await db.dispose()


async def test_replace_moves_two_bookings_of_one_gpus_mig_instances(ledger: Ledger) -> None:
    """Both parts of one GPU move together: the database's cross-node check never sees
    one of them on the new node while its sibling is still on the old one."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = make_inventory("a", pool, gpus=0, mig=2)
    await record_inventory(ledger, a, now)
    mig = [{"class": "gpu.mig", "count": 1}]
    rids = []
    for key in ("m1", "m2"):
        made = await rig.reservations.create(rig.request(pool, key, devices=mig))
        assert isinstance(made, Created), made
        rids.append(made.reservation.reservation_id)
    await record_inventory(ledger, renamed(a, "b"), now)

    done = await replace_node(ledger, "a", "b", "ops", now)

    assert (sorted(done.moved), done.ended) == (sorted(rids), ())
    assert isinstance(await rig.reservations.create(rig.request(pool, "m3", devices=mig)), Refused)
    assert await ledger.rebuild_all(now) == 0


async def test_the_placer_never_offers_a_gpu_another_node_id_holds(
    ledger: Ledger, database_url: str
) -> None:
    """Two node ids of one host both admitted (as a ledger upgraded while both were
    registered has them until the coordinator starts and holds the second): preview and
    create offer only the node that holds the GPUs and say why the other was turned
    away; no GPU is booked twice, and a create past the two is refused for capacity
    (before, the database's claim check refused it: 503, retry)."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = make_inventory("a", pool, gpus=2)
    await record_inventory(ledger, a, now)
    await record_inventory(ledger, renamed(a, "b"), now)
    await as_upgraded(database_url)
    await ledger.rebuild_all(now)

    ask = rig.request(pool, "p", gpus=2)
    seen = await ledger.bookings.preview(pool, ask.placement, now, now + 3_600_000, now, 0)
    assert [p.node_id for p in seen.placement.candidates] == ["a"]
    assert seen.placement.filtered == {DUPLICATE_DEVICES: 1}
    made = [await rig.reservations.create(rig.request(pool, f"k{k}")) for k in range(3)]

    assert [type(m) for m in made] == [Created, Created, Refused]
    promised = [x.atom_id for m in made if isinstance(m, Created) for x in m.reservation.atoms]
    assert sorted(promised) == ["a:gpu:GPU-a-0", "a:gpu:GPU-a-1"]
    refused = made[2]
    assert isinstance(refused, Refused) and refused.error.code == "CAPACITY_NOT_AVAILABLE"
    assert DUPLICATE_DEVICES in str(refused.error.message), refused.error
    # What the coordinator's start does: the second id held; capacity agrees with the
    # placer, 2 physical GPUs, the second id's copies held.
    (held,) = await hold_duplicates(ledger, now)
    assert held.node_id == "b" and "node a" in await hold_reason(ledger, "b")
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocatable, gpu.provisioning, gpu.allocated + gpu.reserved) == (2, 2, 2)
    assert gpu.available == 0
    assert await hold_duplicates(ledger, now) == []
    assert await ledger.rebuild_all(now) == 0


async def test_a_booked_node_showing_devices_another_id_holds_is_held_in_capacity_and_risk(
    ledger: Ledger, database_url: str
) -> None:
    """Two ids of one host both admitted, the holder being the unbooked one (a ledger
    upgraded while both were registered): held when the coordinator starts, the booked
    id counts as provisioning in the rollup, its booking leaves the booked columns and
    its reservation is at risk, as with any node held in provisioning (before: 4
    allocatable GPUs for 2, not at risk)."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    a = make_inventory("a", pool, gpus=2)
    await record_inventory(ledger, a, now)
    made = await rig.reservations.create(rig.request(pool, "k1"))
    assert isinstance(made, Created)
    await record_inventory(ledger, renamed(a, "b"), now)
    await as_upgraded(database_url, "UPDATE device_identities SET node_id = 'b'")
    await ledger.rebuild_all(now)

    (held,) = await hold_duplicates(ledger, now)
    assert held.node_id == "a" and "node b" in await hold_reason(ledger, "a")
    (alert,) = _duplicate_alerts(held.alerts)
    assert alert.details["otherNodeIds"] == ["b"]
    gpu = await rig.row(pool, "gpu")
    assert (gpu.allocatable, gpu.provisioning, gpu.allocated + gpu.reserved) == (2, 2, 0)
    await record_reachability(ledger, ["a"], False, now)
    await record_reachability(ledger, ["a"], True, now)
    got = await ledger.reservations.get(made.reservation.reservation_id, made.reservation.tenant_id)
    assert got.at_risk is not None and got.at_risk.reason == "provisioning", got.at_risk
    assert await ledger.rebuild_all(now) == 0
