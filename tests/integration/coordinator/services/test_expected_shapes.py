"""Expected node shapes (SPEC §4, issue 23) on SQLite and PostgreSQL: a node whose
inventory exceeds its pool's or its profile's expected shape is held in provisioning,
with the reason, until an operator accepts it; what was accepted is not held again,
more than that is."""

from __future__ import annotations

from msgspec.structs import replace

from coordinator.domain.shapes import ExpectedShape
from coordinator.ledger import Ledger
from coordinator.services.node_records import (
    accept_shape,
    record_heartbeat,
    record_inventories,
    record_inventory,
)
from coordinator.services.reservations import Created, Refused
from coordinator.services.shapes import Shapes
from tests.factories import make_heartbeat, make_inventory
from tests.integration.conftest import Served
from tests.rig import Rig


async def _expect(ledger: Ledger, counts: dict[str, int], pool_id: str = "",
                  profile: tuple[str, int] = ("", 0)) -> None:  # fmt: skip
    await ledger.shapes.set(ExpectedShape(pool_id, *profile, counts, 1, "ops"))


async def _events(ledger: Ledger, node_id: str) -> list[tuple[str, str]]:
    return [(e.kind, e.reason) for e in await ledger.catalog.events(node_id, 0, 100)]


HELD = "inventory exceeds the expected shape: gpu 9 > 8"


async def test_a_node_with_more_than_its_pool_expects_is_held_until_accepted(
    ledger: Ledger,
) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    await _expect(ledger, {"gpu": 8, "nic.vf": 32}, pool_id=pool)
    now = rig.clock.now_ms()

    changes = await record_inventory(ledger, make_inventory("big", pool, gpus=9), now)

    assert ("node.provisioning", HELD) in [(t.kind, t.reason) for t in changes.transitions]
    node = await ledger.catalog.node("big")
    assert node is not None and node.state.provisioning and node.shape_hold == HELD
    assert (await rig.row(pool, "gpu")).provisioning == 9
    assert (await rig.row(pool, "gpu")).allocatable == 0
    out = await rig.reservations.create(rig.request(pool, "a", gpus=1))
    assert isinstance(out, Refused)
    # The agent saying it is done provisioning does not end the hold.
    await record_heartbeat(ledger, make_heartbeat(make_inventory("big", pool), seq=2), now)
    await record_inventory(ledger, make_inventory("big", pool, gpus=9, sent_at=1), now)
    node = await ledger.catalog.node("big")
    assert node is not None and node.state.provisioning

    accepted = await accept_shape(ledger, "big", "acme/k1", now)

    assert [t.kind for t in accepted.transitions] == ["node.provisioned"]
    node = await ledger.catalog.node("big")
    assert node is not None and not node.state.provisioning and node.shape_hold == ""
    assert (await rig.row(pool, "gpu")).allocatable == 9
    assert isinstance(await rig.reservations.create(rig.request(pool, "b", gpus=9)), Created)
    # The same inventory again is not held; one with more than was accepted is.
    await record_inventory(ledger, make_inventory("big", pool, gpus=9, sent_at=2), now)
    node = await ledger.catalog.node("big")
    assert node is not None and not node.state.provisioning
    await record_inventory(ledger, make_inventory("big", pool, gpus=10, sent_at=3), now)
    node = await ledger.catalog.node("big")
    assert node is not None and node.shape_hold.endswith("gpu 10 > 8")
    assert ("node.provisioning", node.shape_hold) in await _events(ledger, "big")
    assert await ledger.rebuild_all(now) == 0


async def test_a_profile_shape_holds_new_nodes_of_a_batch_and_fewer_is_no_hold(
    ledger: Ledger,
) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=0)
    await _expect(ledger, {"gpu": 8}, profile=("hgx-h100", 2))
    now = rig.clock.now_ms()
    big = replace(make_inventory("big", pool, gpus=9), profile_id="hgx-h100", profile_version=2)
    other = replace(make_inventory("other", pool, gpus=9), profile_id="hgx-h100",
                    profile_version=1)  # fmt: skip
    small = replace(make_inventory("small", pool, gpus=4), profile_id="hgx-h100",
                    profile_version=2)  # fmt: skip

    await record_inventories(ledger, [big, other, small], now)

    held = {n: (await ledger.catalog.node(n)) for n in ("big", "other", "small")}
    assert {n: (r is not None and r.state.provisioning) for n, r in held.items()} == {
        "big": True, "other": False, "small": False,
    }  # fmt: skip
    assert ("node.provisioning", HELD) in await _events(ledger, "big")
    # Clearing the shape lets the next inventory through.
    await _expect(ledger, {}, profile=("hgx-h100", 2))
    await record_inventory(ledger, replace(big, sent_at=5), now)
    node = await ledger.catalog.node("big")
    assert node is not None and not node.state.provisioning


async def test_operators_set_a_shape_and_accept_a_node_over_http(served: Served) -> None:
    api, ledger = served.api, served.ledger
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "p"}))["poolId"]
    tenant = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    shape = {"poolId": pool, "counts": {"gpu": 8}}
    status, body = await api.call("nodes.setExpectedShape", shape, tenant)
    assert (status, body["error"]["code"]) == (403, "PERMISSION_DENIED")
    set_ = await api.ok("nodes.setExpectedShape", shape)
    assert set_ == {"poolId": pool, "profileId": None, "profileVersion": None,
                    "counts": {"gpu": 8}, "updatedAt": set_["updatedAt"]}  # fmt: skip
    status, body = await api.call("nodes.setExpectedShape", shape | {"profileId": "x"})
    assert (status, body["error"]["code"]) == (400, "INVALID_INPUT")
    await record_inventory(ledger, make_inventory("big", pool, gpus=9), 1)

    node = await api.ok("nodes.get", {"nodeId": "big"})
    assert node["status"] == "provisioning"
    assert node["state"]["provisioning"] == {"value": True, "reason": HELD}
    status, body = await api.call("nodes.acceptShape", {"nodeId": "big"}, tenant)
    assert (status, body["error"]["code"]) == (403, "PERMISSION_DENIED")
    accepted = await api.ok("nodes.acceptShape", {"nodeId": "big"})
    assert accepted == {"nodeId": "big", "poolId": pool, "status": "ready",
                        "provisioning": False, "changed": True}  # fmt: skip
    node = await api.ok("nodes.get", {"nodeId": "big"})
    assert node["state"]["provisioning"] == {"value": False, "reason": ""}
    status, body = await api.call("nodes.acceptShape", {"nodeId": "nope"})
    assert (status, body["error"]["code"]) == (404, "NOT_FOUND")


async def test_setting_a_shape_judges_the_nodes_it_applies_to_at_once(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    shapes = Shapes(ledger, rig.clock, rig.alerts, rig.capacity)
    pool = await rig.pool(nodes=0)
    now = rig.clock.now_ms()
    await record_inventory(ledger, make_inventory("big", pool, gpus=9), now)
    await record_inventory(ledger, make_inventory("new", pool, gpus=9, provisioning=True), now)
    await record_inventory(ledger, make_inventory("fits", pool, gpus=8), now)

    await shapes.expect(pool, None, {"gpu": 8}, "ops")

    held = [(a.node_id, a.kind, a.reason) for a in rig.alerts.alerts]
    assert held == [("big", "node.provisioning", HELD)]
    assert (await rig.row(pool, "gpu")).allocatable == 8
    for node_id, provisioning in (("big", True), ("new", True), ("fits", False)):
        node = await ledger.catalog.node(node_id)
        assert node is not None and node.state.provisioning == provisioning, node_id
    # Cleared: let go at once, each as its agent says (`new` is still provisioning).
    await shapes.expect(pool, None, {}, "ops")
    assert [(a.node_id, a.kind) for a in rig.alerts.alerts[1:]] == [("big", "node.provisioned")]
    node = await ledger.catalog.node("new")
    assert node is not None and node.state.provisioning and node.shape_hold == ""
    assert await ledger.rebuild_all(now) == 0
