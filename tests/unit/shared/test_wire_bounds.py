"""An agent is not trusted to be well behaved: the wire model bounds what it may say
(lengths of the ledger's columns, numbers in range, atoms it owns), and the per-node
rate limiter bounds how often, in bounded memory."""

from __future__ import annotations

import json
from typing import Any

import pytest
from msgspec import ValidationError

from coordinator.domain.rate_limit import RateLimiter
from shared.ids import new_pool_id
from shared.wire import Heartbeat, Inventory
from tests.factories import make_heartbeat, make_inventory

POOL = new_pool_id()


def _inv(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(make_inventory("h100-a", POOL).to_json())
    doc.update(changes)
    return doc


def test_a_well_formed_inventory_and_heartbeat_still_pass() -> None:
    inv = Inventory.from_json(json.dumps(_inv()))
    Heartbeat.from_json(make_heartbeat(inv, interval_ms=3_600_000).to_json())


@pytest.mark.parametrize(
    "changes, where",
    [
        ({"seq": -1}, "$.seq"),
        ({"nodeId": "n1\n"}, "$.nodeId"),  # Python's `$` would let a final newline by
        ({"health": {"status": "fine"}}, "$.health.status"),
        (
            {"devices": [{"deviceId": "GPU-0", "status": "unhealthy", "reasons": ["x"] * 65}]},
            "$.devices[0].reasons",
        ),
    ],
)
def test_a_schema_error_names_the_field(changes: dict[str, Any], where: str) -> None:
    inv = make_inventory("n1", POOL)
    doc = json.loads(make_heartbeat(inv).to_json()) | changes
    with pytest.raises(ValidationError) as caught:
        Heartbeat.from_json(json.dumps(doc))
    assert str(caught.value).endswith(f"at `{where}`")


@pytest.mark.parametrize(
    "what, changes",
    [
        ("vcpu of 2^64", {"scalars": {"vcpu": 2**64}}),
        ("negative memory", {"scalars": {"memoryGiB": -1}}),
        ("100-character bootId", {"bootId": "b" * 100}),
        ("NUL in hostname", {"hostname": "h\x00"}),
        ("huge hostname", {"hostname": "h" * 10_000}),
        ("sentAt past 2^63", {"sentAt": 2**63}),
        ("another node's atom", {"atoms": [{"atomId": "h100-b:node", "class": "node"}]}),
        ("an atom owned by nobody", {"atoms": [{"atomId": "node", "class": "node"}]}),
        (
            "duplicate atom ids",
            {"atoms": [{"atomId": "h100-a:node", "class": "node"}] * 2},
        ),
        ("too many labels", {"labels": {f"k{i}": "v" for i in range(500)}}),
        (
            "an infinite attr",
            {"atoms": [{"atomId": "h100-a:x", "class": "node", "attrs": {"x": 1e999}}]},
        ),
    ],
)
def test_out_of_bounds_inventories_are_schema_errors(what: str, changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Inventory.from_json(json.dumps(_inv(**changes)).replace("Infinity", "1e999"))


@pytest.mark.parametrize(
    "changes",
    [
        {"bootId": "b" * 65},
        {"seq": 2**64},
        {"intervalMs": 3_600_001},
        {"inventoryHash": "x" * 200},
        {"health": {"status": "healthy", "reasons": ["r\x00"]}},
        {"use": [{"deviceId": "GPU-0", "processesOmitted": -1}], "useVersion": 1},
        {"use": [{"deviceId": "GPU-0", "processes": [{"pid": 1}] * 257}], "useVersion": 1},
    ],
)
def test_out_of_bounds_heartbeats_are_schema_errors(changes: dict[str, Any]) -> None:
    inv = make_inventory("n1", POOL)
    doc = json.loads(make_heartbeat(inv).to_json()) | changes
    with pytest.raises(ValidationError):
        Heartbeat.from_json(json.dumps(doc))


@pytest.mark.parametrize("bad", ["mac:b8 ce", "vpd:S\x00", "vpd:é", "g" * 129])
def test_a_nic_identity_out_of_bounds_is_a_schema_error_naming_it(bad: str) -> None:
    """Blanks, NULs and non-ASCII would let one card read as two; over 128 is garbage."""
    nic = {"name": "ens1", "pciAddress": "0000:17:00.0"}
    ok = Inventory.from_json(json.dumps(_inv(nics=[nic | {"physicalId": "mac:b8:ce:f6:0:0:1"}])))
    assert ok.nics[0].physical_id == "mac:b8:ce:f6:0:0:1"
    older = Inventory.from_json(json.dumps(_inv(nics=[nic])))
    assert older.nics[0].physical_id == ""  # an older agent: none, not compared
    with pytest.raises(ValidationError) as caught:
        Inventory.from_json(json.dumps(_inv(nics=[nic | {"physicalId": bad}])))
    assert str(caught.value).endswith("at `$.nics[0].physicalId`")


def test_a_use_list_says_how_many_processes_it_left_out_and_older_agents_still_pass() -> None:
    doc = json.loads(make_heartbeat(make_inventory("n1", POOL)).to_json())
    full = {"deviceId": "GPU-0", "processes": [{"pid": 1}] * 256, "processesOmitted": 45}
    hb = Heartbeat.from_json(json.dumps(doc | {"use": [full], "useVersion": 1}))
    assert hb.use[0].processes_omitted == 45 and len(hb.use[0].processes) == 256
    older = Heartbeat.from_json(json.dumps(doc | {"use": [{"deviceId": "GPU-0"}]}))
    assert older.use[0].processes_omitted == 0


def test_the_rate_limiter_drops_one_noisy_node_and_spares_the_others() -> None:
    limiter = RateLimiter(rate=10, burst=20)
    noisy = sum(limiter.allow("noisy", 0.0) for _ in range(1000))
    assert noisy == 20
    assert all(limiter.allow(f"quiet-{i}", 0.0) for i in range(100))
    # It refills at its rate.
    assert sum(limiter.allow("noisy", 1.0) for _ in range(100)) == 10


def test_the_rate_limiter_stays_bounded_under_a_flood_of_new_ids() -> None:
    limiter = RateLimiter(rate=10, burst=20, max_keys=1000)
    for i in range(50_000):
        limiter.allow(f"forged-{i}", 0.0)
    assert len(limiter) == 1000
    # Once the flood's buckets have refilled they are forgotten and new ids get in.
    assert limiter.allow("late-comer", 10.0)
    assert len(limiter) <= 1000
