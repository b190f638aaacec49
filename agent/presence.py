"""Pure: which GPUs should be there — NVML's reading reconciled with the PCI bus and the
expected inventory, so that a GPU nobody can read is still a device.

NVML enumerates GPUs in PCI bus order, so stand-ins for GPUs whose handle failed
(`missing-nvml-<index>`) are matched, in index order, with the NVIDIA GPUs the PCI bus
shows that no readable GPU accounts for, and take the PCI address as their id
(`missing-pci-<address>`, stable across reboots). PCI GPUs left over after that are GPUs
the driver did not enumerate at all; a count still short of the expected `gpu` count
adds `missing-expected-<k>` stand-ins. Each stand-in has counters saying `unreadable`.
"""

from __future__ import annotations

import msgspec

from agent.readings import GpuCounters, GpuReading, NvmlSnapshot

NVML_STANDIN = "missing-nvml-"


def reconcile(
    snap: NvmlSnapshot, pci_gpus: tuple[str, ...], expected_gpus: int = 0
) -> NvmlSnapshot:
    gpus = list(snap.gpus)
    counters = {c.uuid: c for c in snap.counters}
    accounted = {g.pci_bus_id for g in gpus if g.pci_bus_id}
    free = [p for p in sorted(pci_gpus) if p not in accounted]
    standins = sorted((g for g in gpus if g.uuid.startswith(NVML_STANDIN)), key=lambda g: g.index)
    for gpu, address in zip(standins, free, strict=False):
        renamed = msgspec.structs.replace(gpu, uuid=f"missing-pci-{address}", pci_bus_id=address)
        gpus[gpus.index(gpu)] = renamed
        old = counters.pop(gpu.uuid)
        counters[renamed.uuid] = msgspec.structs.replace(old, uuid=renamed.uuid)
    next_index = max((g.index for g in gpus), default=-1) + 1
    for address in free[len(standins) :]:
        why = f"on the PCI bus at {address} but not enumerated by NVML"
        gpus.append(_standin(next_index, f"missing-pci-{address}", address, why))
        counters[gpus[-1].uuid] = GpuCounters(index=next_index, uuid=gpus[-1].uuid, unreadable=why)
        next_index += 1
    for k in range(len(gpus), expected_gpus):
        why = f"expected {expected_gpus} GPUs, found {len(snap.gpus)}"
        gpus.append(_standin(next_index, f"missing-expected-{k}", "", why))
        counters[gpus[-1].uuid] = GpuCounters(index=next_index, uuid=gpus[-1].uuid, unreadable=why)
        next_index += 1
    if len(gpus) == len(snap.gpus) and not standins:
        return snap
    return msgspec.structs.replace(
        snap,
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        counters=tuple(sorted(counters.values(), key=lambda c: c.index)),
    )


def _standin(index: int, uuid: str, pci: str, why: str) -> GpuReading:
    return GpuReading(
        index=index, uuid=uuid, name="unknown", memory_mib=0, pci_bus_id=pci, missing=why
    )
