"""`gpufleet-agent inventory`: read this host once — NVML (or the simulated profile) and
sysfs — and print what the agent would publish, like `slurmd -C`: GPUs, MIG instances,
NICs, disks, scalars, health, and which atoms it would offer (the boot disk and the
management NIC are listed as not bookable unless the settings offer them). Table or
JSON (`-o json`); exit 0 after printing, 2 for bad settings.

Nothing here runs in the long-lived agent: `agent.main` imports this module only for
the subcommand, and it needs no NATS and no pool (a placeholder stands in when none is
configured). Without the NVML binding it still shows NICs, disks and scalars, and says
the node would be `unmonitored`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from agent.config import Settings
from agent.errors import exit_status
from agent.health import Finding, HealthPolicy, HealthState, evaluate
from agent.inventory import Identity, build_inventory
from agent.nvml import NvmlMissing, real_nvml
from agent.presence import reconcile
from agent.readings import HostReading, NvmlSnapshot
from agent.sysfs import read_host, read_ports
from agent.xid import XidTable
from procs.settings import ConfigError, load
from shared.wire import Inventory

PLACEHOLDER_POOL = "pool_" + "0" * 26
USAGE = "usage: gpufleet-agent inventory [-o table|json] [agent settings flags, see --help]"


def _output(argv: Sequence[str]) -> tuple[str, list[str]]:
    rest, fmt, args = [], "table", list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-o", "--output") and args:
            fmt = args.pop(0)
        elif arg.startswith("--output="):
            fmt = arg.split("=", 1)[1]
        elif arg == "--json":
            fmt = "json"
        else:
            rest.append(arg)
    if fmt not in ("table", "json"):
        raise ConfigError("output", f"{fmt!r} is not table or json")
    return fmt, rest


def _nvml_snapshot(settings: Settings, cpu_count: int | None) -> NvmlSnapshot:
    try:
        if settings.simulate is None:
            nvml = real_nvml()
        else:
            from agent.sim.faults import FaultFile
            from agent.sim.nvml import SimulatedNvml
            from agent.sim.profile import load_profile

            profile = load_profile(settings.simulate)
            nvml = SimulatedNvml(profile, settings.node_id, FaultFile(settings.fault_file))
        from agent.reader import NvmlReader  # imports pynvml: only once it is known present
    except NvmlMissing as exc:
        return NvmlSnapshot(error=str(exc), problems=(str(exc),))
    reader = NvmlReader(nvml, cpu_count=cpu_count)
    try:
        return reader.read()
    finally:
        reader.close()


def read_once(settings: Settings, root: Path, expected: Mapping[str, int]) -> Inventory:
    cpu_count = None
    if settings.simulate is not None:
        from agent.sim.profile import load_profile

        cpu_count = load_profile(settings.simulate).vcpu
    host: HostReading = read_host(root, settings.management_nics)
    snap = reconcile(_nvml_snapshot(settings, cpu_count), host.gpu_pci, expected.get("gpu", 0))
    ident = Identity(
        node_id=settings.node_id,
        pool_id=settings.pool_id,
        hostname=socket.gethostname(),
        labels=settings.label_pairs,
        provisioning=settings.provisioning,
        profile_id=settings.profile_id,
        profile_version=settings.profile_version,
    )
    inventory = build_inventory(
        ident, snap, host, settings.sharing_rules, boot_id="inventory",
        sent_at=int(time.time() * 1000), offer_boot_disks=settings.offer_boot_disks,
        offer_management_nics=settings.offer_management_nics, expected=dict(expected),
    )  # fmt: skip
    ports = read_ports(root, host.nics)
    extra: dict[str, tuple[Finding, ...]] = {}
    for atom in inventory.atoms:
        if atom.cls == "nic.vf" and atom.device_id:
            extra[atom.device_id] = tuple(("unhealthy", w) for w in ports.get(atom.device_id, ()))
        missing = atom.attrs.get("missing")
        if atom.device_id.startswith("missing:") and isinstance(missing, str):
            extra[atom.device_id] = (("unhealthy", f"missing: {missing}"),)
    h = settings.health
    policy = HealthPolicy(
        xids=XidTable.configured(h.xid_faults, h.xid_ignore),
        recover_after_s=h.recover_after_s,
        xid_hold_s=h.xid_hold_s,
    )
    health = evaluate(HealthState(), snap.counters, (), 0.0, policy, snap.error, extra=extra)
    return msgspec.structs.replace(
        inventory, health=health.node, devices=health.unhealthy_devices()
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [list(header), *[["-" if v in (None, "") else str(v) for v in r] for r in rows]]
    widths = [max(len(r[k]) for r in cells) for k in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in cells]  # fmt: skip


def render(inv: Inventory) -> str:
    health = {d.device_id: d for d in inv.devices}

    def status(device_id: str) -> str:
        d = health.get(device_id)
        return "healthy" if d is None else f"{d.status} ({'; '.join(d.reasons)})"

    offered: dict[str, int] = {}
    for atom in inv.atoms:
        offered[atom.cls] = offered.get(atom.cls, 0) + 1
    nvml = (
        f"driver {inv.driver_version}, CUDA {inv.cuda_version}"
        if inv.driver_version
        else "not readable"
    )
    out = [
        f"host {inv.hostname}  node {inv.node_id}  pool "
        + (inv.pool_id if inv.pool_id != PLACEHOLDER_POOL else "(not set)"),
        f"NVML: {nvml}",
        f"health: {inv.health.status}"
        + (f" ({'; '.join(inv.health.reasons)})" if inv.health.reasons else ""),
        f"scalars: {inv.scalars.vcpu} vCPU, {inv.scalars.memory_gib} GiB memory, "
        f"{inv.scalars.hugepages_1gi} × 1 GiB hugepages",
        "",
        f"GPUs ({len(inv.gpus)}):",
    ]
    out += _table(
        ("IDX", "MODEL", "MEMORY MiB", "PCI", "NUMA", "MIG", "NVLINK", "SHARING", "HEALTH"),
        [
            (g.index, g.name, g.memory_mib, g.pci_bus_id, g.numa_node,
             f"{len(g.mig_instances)} instances" if g.mig_enabled else "off",
             g.nvlink_clique, f"{g.sharing}×{g.replicas}" if g.replicas > 1 else g.sharing,
             status(g.uuid))
            for g in inv.gpus
        ],
    )  # fmt: skip
    migs = [(g.index, m.profile, m.memory_mib, m.uuid) for g in inv.gpus for m in g.mig_instances]
    if migs:
        out += ["", "MIG instances:", *_table(("GPU", "PROFILE", "MEMORY MiB", "UUID"), migs)]
    out += ["", f"NICs ({len(inv.nics)}):"]
    out += _table(
        ("NAME", "PCI", "SPEED", "VFS", "ID", "BOOKABLE", "HEALTH"),
        [
            (n.name, n.pci_address, f"{n.speed_mbps // 1000}G" if n.speed_mbps else None,
             f"{n.sriov_num_vfs}/{n.sriov_total_vfs}", n.physical_id or None,
             "yes" if n.bookable else "no (management)", status(n.pci_address or n.name))
            for n in inv.nics
        ],
    )  # fmt: skip
    out += ["", f"disks ({len(inv.disks)}):"]
    out += _table(
        ("NAME", "SIZE GiB", "MODEL", "ID", "BOOKABLE"),
        [
            (d.name, d.size_bytes // 1024**3, d.model, d.device_id,
             "yes" if d.bookable else "no (boot disk)")
            for d in inv.disks
        ],
    )  # fmt: skip
    out += ["", "atoms it would offer: " + ", ".join(f"{n} {c}" for c, n in offered.items())]
    return "\n".join(out)


def read_settings(settings: Settings) -> Inventory:
    """This host's inventory as the agent with these settings would publish it (a
    simulated profile gets a sysfs tree of its own for the read)."""
    expected: dict[str, int] = {str(cls): n for cls, n in settings.expected.items()}
    if settings.simulate is None:
        return read_once(settings, settings.sysfs_root, expected)
    import tempfile

    from agent.sim.profile import load_profile
    from agent.sim.sysfs_tree import build_tree

    profile = load_profile(settings.simulate)
    expected = expected or dict(profile.expected)
    settings = msgspec.structs.replace(
        settings,
        profile_id=settings.profile_id or profile.id,
        profile_version=settings.profile_version or profile.version,
    )
    if settings.sysfs_root != Path("/"):
        return read_once(settings, settings.sysfs_root, expected)
    with tempfile.TemporaryDirectory(prefix="gpufleet-sysfs-") as tmp:
        root = build_tree(Path(tmp), profile, settings.node_id)
        return read_once(settings, root, expected)


def main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    try:
        fmt, rest = _output(argv)
        settings = load(Settings, rest, env, defaults={"pool_id": PLACEHOLDER_POOL})
    except ConfigError as exc:
        return exit_status(exc, "inventory", hint=USAGE)
    inv = read_settings(settings)
    if fmt == "json":
        data = msgspec.to_builtins(inv)
        if data["poolId"] == PLACEHOLDER_POOL:
            data["poolId"] = None
        print(json.dumps(data, indent=2))
    else:
        print(render(inv))
    return 0
