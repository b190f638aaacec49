"""nodes.inventories over HTTP: a pool's nodes with the hardware their agents reported
(what `gpufleet slurm conf` renders), a page at a time, for operators only."""

from __future__ import annotations

from pathlib import Path

import msgspec

from coordinator.services.node_records import record_inventory
from tests.factories import make_inventory
from tests.integration.conftest import Served
from tests.unit.agent.test_inventory import inventory_of


async def test_a_pools_nodes_come_with_their_gpus_hardware(served: Served, tmp_path: Path) -> None:
    api = served.api
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "train"}))["poolId"]
    other = (await api.ok("pools.create", {"tenantId": "acme", "name": "other"}))["poolId"]
    a100 = inventory_of("a100-mig-8", tmp_path, "a100-m", labels=(("rack", "r1"),))
    await record_inventory(served.ledger, msgspec.structs.replace(a100, pool_id=pool), 1)
    await record_inventory(served.ledger, make_inventory("b-node", pool, gpus=2), 1)
    await record_inventory(served.ledger, make_inventory("elsewhere", other, gpus=2), 1)

    first = await api.ok("nodes.inventories", {"poolId": pool, "limit": 1})
    assert first["poolName"] == "train"
    (node,) = first["nodes"]
    assert node["nodeId"] == "a100-m" and node["reported"] is True
    assert node["labels"]["rack"] == "r1"
    assert node["resources"] == {"vcpu": 256, "memoryGiB": 1024, "hugepages1Gi": 256}
    gpus = node["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert gpus[4]["cpuAffinity"] == "64-127,192-255" and gpus[4]["numaNode"] == 1
    # The CPUs as sysfs lays them out (for Slurm's Sockets=, CoresPerSocket=, ...).
    assert node["cpuTopology"] == {"sockets": 2, "coresPerSocket": 64, "threadsPerCore": 2}
    assert len(gpus[4]["nvlinkPeers"]) == 6  # the six NVSwitches
    assert gpus[1]["migEnabled"] and len(gpus[1]["migInstances"]) == 7
    assert gpus[1]["migInstances"][0]["profile"] == "1g.10gb"

    rest = await api.ok("nodes.inventories", {"poolId": pool, "cursor": first["nextCursor"]})
    assert [n["nodeId"] for n in rest["nodes"]] == ["b-node"] and rest["nextCursor"] is None
    assert rest["nodes"][0]["cpuTopology"] is None  # its agent did not say


async def test_tenants_may_not_and_an_unknown_pool_is_not_found(served: Served) -> None:
    api = served.api
    await api.ok("tenants.create", {"tenantId": "acme"})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "train"}))["poolId"]
    key = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
    status, answer = await api.call("nodes.inventories", {"poolId": pool}, key)
    assert (status, answer["error"]["code"]) == (403, "PERMISSION_DENIED")
    status, answer = await api.call("nodes.inventories", {"poolId": "pool_" + "0" * 26})
    assert (status, answer["error"]["code"]) == (404, "NOT_FOUND")
