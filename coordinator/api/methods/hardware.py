"""nodes.inventories: a pool's nodes with the hardware their agents last reported (every
GPU's index, PCI address, NUMA node and CPU affinity, NVLink peers and cliques, MIG
instances), for tools that describe the fleet to a scheduler (`gpufleet slurm conf`).

Operators only: it is the hardware behind atoms, which tenants see as attributes.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from coordinator.api.http.context import CallContext
from coordinator.api.http.cursor import decode_id_cursor, encode_cursor
from coordinator.api.http.registry import REGISTRY
from coordinator.api.shapes.base import ApiInput, ApiOutput
from coordinator.api.shapes.fields import PoolId
from coordinator.api.shapes.node_outputs import NodeResources
from coordinator.api.shapes.outputs import Cursor
from coordinator.domain.errors import NotFound
from coordinator.domain.model import NodeRecord
from shared.wire import CpuTopology, GpuInfo, Inventory, Sharing


class InventoriesInput(ApiInput):
    pool_id: PoolId = Field(description="The pool whose nodes to describe.")
    cursor: Annotated[str, Field(max_length=512)] | None = Field(
        default=None, description="The previous page's nextCursor."
    )
    limit: Annotated[int, Field(ge=1, le=1000)] = Field(default=100, description="Page size.")


class MigOut(ApiOutput):
    uuid: str = Field(description="The MIG instance's UUID.")
    gpu_instance_id: int = Field(description="Its GPU instance id.")
    compute_instance_id: int = Field(description="Its compute instance id.")
    profile: str = Field(description="Its profile, e.g. 1g.10gb.", examples=["1g.10gb"])
    memory_mib: int = Field(alias="memoryMiB", description="Its memory, MiB.")


class GpuOut(ApiOutput):
    uuid: str = Field(description="The GPU's UUID.")
    index: int = Field(description="NVML's index (the X of /dev/nvidiaX on most hosts).")
    name: str = Field(description="Its model as NVML names it.")
    memory_mib: int = Field(alias="memoryMiB", description="Its memory, MiB.")
    pci_bus_id: str = Field(description="Its PCI address.")
    numa_node: int | None = Field(description="Its NUMA node (-1: the kernel does not say).")
    cpu_affinity: str | None = Field(
        description="The CPUs close to it, in the kernel's cpulist format.", examples=["0-27,56-83"]
    )
    nvlink_peers: list[str] = Field(
        description="The PCI address at the far end of each active NVLink (a GPU or NVSwitch)."
    )
    nvlink_clique: str | None = Field(description="Its NVLink clique on the node.")
    fabric_clique: str | None = Field(description="Its multi-node NVLink fabric clique.")
    mig_enabled: bool = Field(description="Whether it is MIG partitioned.")
    mig_instances: list[MigOut] = Field(description="Its MIG instances.")
    sharing: Sharing = Field(description="exclusive, or how it is shared (time-slice, mps).")
    replicas: int = Field(description="Its slots when shared (1 otherwise).")
    missing: str | None = Field(description="Why NVML cannot read it (held unhealthy).")


class CpuTopologyOut(ApiOutput):
    sockets: int = Field(description="CPU sockets.")
    cores_per_socket: int = Field(description="Cores in each socket.")
    threads_per_core: int = Field(description="Hardware threads per core (SMT).")


class NodeHardware(ApiOutput):
    node_id: str = Field(description="The node.", examples=["gpu-host-01"])
    hostname: str = Field(description="Its host name.")
    labels: dict[str, str] = Field(description="Its labels (rack, zone, derived ones).")
    resources: NodeResources = Field(description="Its scalar resources.")
    reported: bool = Field(description="False when no full inventory is on record yet.")
    cpu_topology: CpuTopologyOut | None = Field(
        default=None,
        description="Its CPUs as sysfs lays them out (null: not reported by its agent).",
    )
    gpus: list[GpuOut] = Field(description="Its GPUs by index (empty when not reported).")


class InventoryPage(ApiOutput):
    pool_id: PoolId = Field(description="The pool.")
    pool_name: str = Field(description="Its name.")
    nodes: list[NodeHardware] = Field(description="This page, by nodeId.")
    next_cursor: Cursor


def gpu_out(gpu: GpuInfo) -> GpuOut:
    return GpuOut(
        uuid=gpu.uuid,
        index=gpu.index,
        name=gpu.name,
        memory_mib=gpu.memory_mib,
        pci_bus_id=gpu.pci_bus_id,
        numa_node=gpu.numa_node,
        cpu_affinity=gpu.cpu_affinity,
        nvlink_peers=list(gpu.nvlink_peers),
        nvlink_clique=gpu.nvlink_clique,
        fabric_clique=gpu.fabric_clique,
        mig_enabled=gpu.mig_enabled,
        mig_instances=[
            MigOut(
                uuid=m.uuid,
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
                profile=m.profile,
                memory_mib=m.memory_mib,
            )
            for m in gpu.mig_instances
        ],
        sharing=gpu.sharing,
        replicas=gpu.replicas,
        missing=gpu.missing,
    )


def topology_out(t: CpuTopology | None) -> CpuTopologyOut | None:
    if t is None:
        return None
    return CpuTopologyOut(
        sockets=t.sockets, cores_per_socket=t.cores_per_socket, threads_per_core=t.threads_per_core
    )


def hardware_out(node: NodeRecord, inv: Inventory | None) -> NodeHardware:
    return NodeHardware(
        node_id=node.node_id,
        hostname=node.hostname,
        labels=dict(node.labels),
        resources=NodeResources(
            vcpu=node.vcpu, memory_gib=node.memory_gib, hugepages1_gi=node.hugepages_1gi
        ),
        reported=inv is not None,
        cpu_topology=topology_out(inv.cpu_topology) if inv is not None else None,
        gpus=[gpu_out(g) for g in sorted(inv.gpus, key=lambda g: g.index)] if inv else [],
    )


@REGISTRY.method(
    "nodes.inventories", kind="read", permission="platform:admin", scope="platform",
    input=InventoriesInput, output=InventoryPage, phase="v0.4",
)  # fmt: skip
async def nodes_inventories(ctx: CallContext, body: InventoriesInput) -> InventoryPage:
    """A pool's nodes with the hardware their agents last reported, a page at a time
    (operator): GPUs with PCI address, NUMA node, CPU affinity, NVLink peers and
    cliques, MIG instances; labels and scalar resources."""
    pool = await ctx.ledger.pools.get(body.pool_id)
    if pool is None:
        raise NotFound(f"pool {body.pool_id} not found")
    after = decode_id_cursor(body.cursor) if body.cursor else None
    found = await ctx.ledger.catalog.inventories(pool.pool_id, after, body.limit + 1)
    page, more = found[: body.limit], len(found) > body.limit
    return InventoryPage(
        pool_id=pool.pool_id,
        pool_name=pool.name,
        nodes=[hardware_out(n.node, n.inventory) for n in page],
        next_cursor=encode_cursor(page[-1].node.node_id) if more and page else None,
    )
