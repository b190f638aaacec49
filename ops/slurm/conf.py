"""Slurm's view of one or more pools, from the hardware its agents reported (`nodes.inventories`):
gres.conf lines, the `NodeName` lines for slurm.conf, and a topology.conf.

- gres.conf: per whole GPU `Name=gpu Type=<short model> File=<dev>/nvidia<index>`, its
  `Cores=` from NVML's CPU affinity and `Links=` from the NVLink matrix; per MIG instance
  its own type `<short model>_<profile>` over the GPU's file and the instance's two
  nvidia-caps files. A GPU NVML cannot read is left out (Slurm must not schedule it).
- `NodeName=` lines: `CPUs=`, `RealMemory=` (MiB), `Gres=` counted per type, `Features=`
  (the pool, each GPU model, `nvlink<N>` for the largest NVLink clique, the multi-node
  fabric clique), `NodeHostname=` when it is not the node id.
- topology.conf: a leaf switch per value of a node label (`rack` by default, or the
  label gangs are placed by), under one top switch: the pool's, or `gpufleet` when
  several pools share one set of files (Slurm's tree wants one root).

Pure and deterministic (no clock, no I/O): the same inventories give the same bytes, so
the files can be regenerated and diffed. `gpufleet slurm conf` fetches and writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ops.kit.errors import OpsError
from shared.cliques import maximal_cliques, peer_sets
from shared.ids import normalize_pci
from shared.slurm_gres import GresGpu, GresMig, gres_devices, short_model, token

# /proc/driver/nvidia-caps/mig-minors: config 1, monitor 2, then per GPU 15 GPU
# instances of 9 minors each (the instance's access, then its 8 compute instances').
_MIG_FIRST, _MIG_PER_GPU, _MIG_PER_GI = 3, 15 * 9, 9


class SlurmConfError(OpsError, ValueError):
    """An inventory that cannot be described to Slurm (a malformed answer)."""


@dataclass(frozen=True)
class Mig:
    profile: str
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    pci_bus_id: str
    cpu_affinity: str | None = None
    nvlink_peers: tuple[str, ...] = ()
    mig_enabled: bool = False
    migs: tuple[Mig, ...] = ()
    missing: str | None = None


@dataclass(frozen=True)
class Node:
    node_id: str
    hostname: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    vcpu: int = 0
    memory_gib: int = 0
    reported: bool = True
    gpus: tuple[Gpu, ...] = ()
    # (sockets, cores per socket, threads per core) as the agent read sysfs; None: not said
    topology: tuple[int, int, int] | None = None

    def threads(self, default: int) -> int:
        """Threads per core: the host's when its agent said, else `default`."""
        return self.topology[2] if self.topology else default


@dataclass(frozen=True)
class Options:
    dev_dir: str = "/dev"
    topology_key: str = "rack"
    threads_per_core: int = 1
    # A Slurm socket per whole GPU (its own block of cores): what lets a core-bound
    # reservation on Slurm before 23.11 hold single GPUs (gres binding is per socket).
    socket_per_gpu: bool = False


@dataclass(frozen=True)
class SlurmConf:
    gres: str
    nodes: str
    topology: str


# --- reading the API's answer ---------------------------------------------------------


def nodes_from_api(items: Iterable[Mapping[str, Any]]) -> list[Node]:
    """`nodes.inventories`' nodes as values; a missing field is a SlurmConfError."""
    try:
        return [_node(item) for item in items]
    except (KeyError, TypeError, ValueError) as exc:
        raise SlurmConfError(f"unexpected nodes.inventories answer: {exc!r}") from None


def _node(item: Mapping[str, Any]) -> Node:
    res = item["resources"]
    return Node(
        node_id=str(item["nodeId"]),
        hostname=str(item.get("hostname") or ""),
        labels={str(k): str(v) for k, v in item.get("labels", {}).items()},
        vcpu=int(res["vcpu"]),
        memory_gib=int(res["memoryGiB"]),
        reported=bool(item.get("reported", True)),
        topology=_cpu_topology(item.get("cpuTopology")),
        gpus=tuple(
            Gpu(
                index=int(g["index"]),
                name=str(g["name"]),
                pci_bus_id=str(g["pciBusId"]),
                cpu_affinity=g.get("cpuAffinity"),
                nvlink_peers=tuple(str(p) for p in g.get("nvlinkPeers", ())),
                mig_enabled=bool(g.get("migEnabled", False)),
                migs=tuple(
                    Mig(str(m["profile"]), int(m["gpuInstanceId"]), int(m["computeInstanceId"]))
                    for m in g.get("migInstances", ())
                ),
                missing=g.get("missing"),
            )
            for g in item.get("gpus", ())
        ),
    )


def _cpu_topology(item: Mapping[str, Any] | None) -> tuple[int, int, int] | None:
    if not item:
        return None
    return int(item["sockets"]), int(item["coresPerSocket"]), int(item["threadsPerCore"])


# --- small pieces ---------------------------------------------------------------------


def parse_cpulist(text: str) -> list[int]:
    """The kernel's cpulist format (`0-27,56-83`) as CPU numbers."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmConfError(f"not a CPU list: {text!r}")
        out.update(range(int(lo), int(hi if sep else lo) + 1))
    return sorted(out)


def ranges(numbers: Iterable[int]) -> str:
    """[0, 1, 2, 5] → `0-2,5`."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(set(numbers)):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [n]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def cores(gpu: Gpu, vcpu: int, threads_per_core: int) -> str | None:
    """Slurm's logical core indices for the GPU's CPU affinity: with T threads per core,
    CPU c is core c mod (CPUs / T), Linux's numbering of SMT siblings. None when the
    affinity is unknown or does not fit the node's CPUs."""
    if not gpu.cpu_affinity or vcpu <= 0 or vcpu % threads_per_core:
        return None
    n_cores = vcpu // threads_per_core
    cpus = parse_cpulist(gpu.cpu_affinity)
    if not cpus or cpus[-1] >= vcpu:
        return None
    return ranges(c % n_cores for c in cpus)


def links(gpus: Sequence[Gpu]) -> dict[int, str]:
    """GPU index → its `Links=` (per GPU in PCI order: -1 itself, 0 none, else how many
    NVLinks join them, directly or through NVSwitches both reach)."""
    ordered = sorted(gpus, key=lambda g: normalize_pci(g.pci_bus_id))
    pcis = {normalize_pci(g.pci_bus_id) for g in ordered}
    remotes = {g.index: [normalize_pci(p) for p in g.nvlink_peers] for g in ordered}
    out: dict[int, str] = {}
    for a in ordered:
        row: list[int] = []
        a_switches = [r for r in remotes[a.index] if r not in pcis]
        for b in ordered:
            if b.index == a.index:
                row.append(-1)
                continue
            direct = remotes[a.index].count(normalize_pci(b.pci_bus_id))
            b_switches = set(remotes[b.index]) - pcis
            row.append(direct or sum(1 for r in a_switches if r in b_switches))
        out[a.index] = ",".join(str(n) for n in row)
    return out


def largest_clique(gpus: Sequence[Gpu]) -> int:
    """How many GPUs the node's largest all-to-all NVLink set holds (0: none linked)."""
    linked = [g for g in gpus if g.nvlink_peers]
    peers = peer_sets((str(g.index), g.pci_bus_id, g.nvlink_peers) for g in linked)
    at = {str(g.index): i for i, g in enumerate(linked)}
    adjacency = [sum(1 << at[p] for p in peers[str(g.index)]) for g in linked]
    best = max((bin(c).count("1") for c in maximal_cliques(adjacency)), default=0)
    return best if best >= 2 else 0


# --- the three files ------------------------------------------------------------------


def gpu_blocks(node: Node, threads_per_core: int) -> dict[int, str]:
    """GPU index → a block of cores of its own (`--socket-per-gpu`): the node's cores cut
    into as many equal blocks as it has GPUs, given in the order of the GPUs' CPU
    affinity (so each block lies where its GPU's does, as far as they go). Empty when
    the node has MIG or unreadable GPUs, or its cores do not divide evenly."""
    gpus = list(node.gpus)
    if not gpus or any(g.mig_enabled or g.missing for g in gpus) or node.vcpu <= 0:
        return {}
    if node.vcpu % threads_per_core:
        return {}
    n_cores = node.vcpu // threads_per_core
    if n_cores % len(gpus):
        return {}
    per = n_cores // len(gpus)

    def near(g: Gpu) -> tuple[int, int]:
        cpus = parse_cpulist(g.cpu_affinity) if g.cpu_affinity else []
        return (min((c % n_cores for c in cpus), default=0), g.index)

    ordered = sorted(gpus, key=near)
    return {g.index: ranges(range(k * per, (k + 1) * per)) for k, g in enumerate(ordered)}


@dataclass(frozen=True)
class _GresLine:
    gres_type: str
    text: str


def _gres_lines(node: Node, opts: Options) -> list[_GresLine]:
    usable = [g for g in node.gpus if not g.missing]
    whole = [g for g in usable if not g.mig_enabled]
    # Links= numbers a node's GPUs in PCI order; with MIG instances among them that
    # numbering is not Slurm's, so a node with MIG gets none.
    link_rows = links(whole) if whole and len(whole) == len(usable) else {}
    dev = opts.dev_dir.rstrip("/")
    out: list[_GresLine] = []
    threads = node.threads(opts.threads_per_core)
    blocks = gpu_blocks(node, threads) if opts.socket_per_gpu else {}
    by_index = {g.index: g for g in usable}
    shapes = (
        GresGpu(g.index, g.name, mig_enabled=g.mig_enabled,
                migs=tuple(GresMig(m.profile, m.gpu_instance_id, m.compute_instance_id)
                           for m in g.migs))
        for g in usable
    )  # fmt: skip
    # In Slurm's index order, which the TaskProlog maps back to UUIDs by (shared.slurm_gres).
    for device in gres_devices(shapes):
        gpu = by_index[device.gpu.index]
        where = blocks.get(gpu.index) or cores(gpu, node.vcpu, threads)
        tail = f" Cores={where}" if where else ""
        mig = device.mig
        if mig is None:
            has_links = any(n > 0 for n in map(int, link_rows.get(gpu.index, "0").split(",")))
            link = f" Links={link_rows[gpu.index]}" if has_links else ""
            text = f"NodeName={node.node_id} Name=gpu Type={device.gres_type}"
            text += f" File={dev}/nvidia{gpu.index}"
            out.append(_GresLine(device.gres_type, text + tail + link))
            continue
        gi = _MIG_FIRST + gpu.index * _MIG_PER_GPU + mig.gpu_instance_id * _MIG_PER_GI
        ci = gi + 1 + mig.compute_instance_id
        caps = f"{dev}/nvidia-caps/nvidia-cap"
        files = f"{dev}/nvidia{gpu.index},{caps}{gi},{caps}{ci}"
        text = f"NodeName={node.node_id} Name=gpu Type={device.gres_type} MultipleFiles={files}"
        out.append(_GresLine(device.gres_type, text + tail))
    return out


def _features(pool_name: str, node: Node) -> list[str]:
    usable = [g for g in node.gpus if not g.missing]
    out = [f"pool-{token(pool_name)}"]
    out += sorted({short_model(g.name) for g in usable})
    clique = largest_clique([g for g in usable if not g.mig_enabled])
    if clique:
        out.append(f"nvlink{clique}")
    fabric = node.labels.get("nvlink.fabric")
    if fabric:
        out.append(f"fabric-{token(fabric)}")
    return out


def _node_line(pool_name: str, node: Node, gres: Sequence[_GresLine], opts: Options) -> str:
    parts = [f"NodeName={node.node_id}"]
    if node.hostname and node.hostname != node.node_id:
        parts.append(f"NodeHostname={node.hostname}")
    threads = node.threads(opts.threads_per_core)
    blocks = gpu_blocks(node, threads) if opts.socket_per_gpu else {}
    if node.vcpu:
        parts.append(f"CPUs={node.vcpu}")
        if blocks:
            per = node.vcpu // threads // len(blocks)
            parts.append(f"Sockets={len(blocks)} CoresPerSocket={per}")
        elif node.topology and node.topology[0] * node.topology[1] * threads == node.vcpu:
            # As `slurmd -C` prints it: slurmd finds the host as configured.
            parts.append(f"Sockets={node.topology[0]} CoresPerSocket={node.topology[1]}")
        if blocks or node.topology or threads > 1:
            parts.append(f"ThreadsPerCore={threads}")
    if node.memory_gib:
        parts.append(f"RealMemory={node.memory_gib * 1024}")
    counts: dict[str, int] = {}
    for line in gres:
        counts[line.gres_type] = counts.get(line.gres_type, 0) + 1
    if counts:
        parts.append("Gres=" + ",".join(f"gpu:{t}:{n}" for t, n in sorted(counts.items())))
    parts.append("Features=" + ",".join(_features(pool_name, node)))
    return " ".join(parts)


def _leaves(nodes: Sequence[Node], key: str) -> dict[str, list[str]]:
    leaves: dict[str, list[str]] = {}
    for node in nodes:
        value = node.labels.get(key)
        leaf = token(value) if value else f"no-{token(key)}"
        leaves.setdefault(leaf, []).append(node.node_id)
    return leaves


def _topology(root: str, nodes: Sequence[Node], key: str) -> list[str]:
    """A leaf switch per label value (a rack holds nodes of any pool), all under one
    root: Slurm's tree plugin wants exactly one."""
    leaves = _leaves(nodes, key)
    lines = [f"SwitchName={leaf} Nodes={','.join(ids)}" for leaf, ids in sorted(leaves.items())]
    if leaves:
        lines.append(f"SwitchName={root} Switches={','.join(sorted(leaves))}")
    return lines


def render(pool_name: str, nodes: Iterable[Node], opts: Options = Options()) -> SlurmConf:
    """The three files for one pool's nodes."""
    return render_pools([(pool_name, nodes)], opts)


# The topology root when several pools share one set of files.
MULTI_POOL_ROOT = "gpufleet"


def render_pools(
    pools: Sequence[tuple[str, Iterable[Node]]], opts: Options = Options()
) -> SlurmConf:
    """The three files for several pools' nodes (one Slurm cluster running them all):
    every node once, in pool order, and one topology root (`pool-<name>` for one pool,
    `gpufleet` for several)."""
    if opts.threads_per_core < 1:
        raise SlurmConfError("threads per core must be at least 1")
    if not pools:
        raise SlurmConfError("no pool given")
    names = ", ".join(name for name, _ in pools)
    plural = "s" if len(pools) > 1 else ""
    head = f"# gpufleet slurm conf: pool{plural} {names}; generated, do not edit"
    gres_out = [head]
    node_out = [head, "# In slurm.conf: GresTypes=gpu, then Include this file."]
    topo_out = [head, f"# Leaf switches: the node label {opts.topology_key!r}."]
    listed: list[Node] = []
    seen: set[str] = set()
    for pool_name, nodes in pools:
        for node in sorted(nodes, key=lambda n: n.node_id):
            if node.node_id in seen:
                raise SlurmConfError(f"node {node.node_id} is in two of the pools given")
            seen.add(node.node_id)
            if not node.reported:
                note = f"# {node.node_id}: no inventory on record yet, left out"
                gres_out.append(note)
                node_out.append(note)
                continue
            gres = _gres_lines(node, opts)
            left_out = [g.index for g in node.gpus if g.missing]
            if left_out:
                gres_out.append(f"# {node.node_id}: GPU {ranges(left_out)} unreadable, left out")
            gres_out += [g.text for g in gres]
            node_out.append(_node_line(pool_name, node, gres, opts))
            listed.append(node)
    root = f"pool-{token(pools[0][0])}" if len(pools) == 1 else MULTI_POOL_ROOT
    topo_out += _topology(root, listed, opts.topology_key)
    return SlurmConf(
        gres="\n".join(gres_out) + "\n",
        nodes="\n".join(node_out) + "\n",
        topology="\n".join(topo_out) + "\n",
    )
