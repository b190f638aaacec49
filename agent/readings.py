"""What the agent read from the host, as plain frozen values.

These sit between the readers (NVML, sysfs), which do I/O and swallow errors, and the
pure functions (inventory, health), which never touch the host. A field that could not
be read is `None`; `problems` says why, once, in words an operator can act on.
"""

from __future__ import annotations

import msgspec


class MigReading(msgspec.Struct, frozen=True):
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    memory_mib: int


class GpuReading(msgspec.Struct, frozen=True):
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int | None = None
    cpu_affinity: str | None = None
    compute_capability: str | None = None
    mig_enabled: bool = False
    migs: tuple[MigReading, ...] = ()
    # PCI bus ids at the far end of each active NVLink (a peer GPU or an NVSwitch).
    nvlink_remotes: tuple[str, ...] = ()
    nvlink_active: tuple[int, ...] = ()
    fabric_clique: str | None = None
    # Why NVML could not read this GPU (handle or UUID failed, lost before its first good
    # read, on the PCI bus but not enumerated); the reading is then the last good one, or
    # a placeholder whose `uuid` is a stable stand-in (`missing-pci-<address>`).
    missing: str | None = None


class NvmlSnapshot(msgspec.Struct, frozen=True):
    """One full NVML read. `error` is set when NVML itself is unusable (node unmonitored)."""

    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[GpuReading, ...] = ()
    counters: tuple[GpuCounters, ...] = ()
    lost: tuple[int, ...] = ()
    error: str | None = None
    problems: tuple[str, ...] = ()
    # Counts NVML sessions (each successful nvmlInit after a shutdown or a dead session):
    # objects from an older session, such as an XID event set, are dead.
    generation: int = 0


class GpuCounters(msgspec.Struct, frozen=True):
    """Health inputs polled from one GPU; `None` means the GPU does not support that
    counter, which is never a fault by itself."""

    index: int
    uuid: str
    lost: bool = False
    dbe_volatile: int | None = None
    retired_pages: int | None = None
    retired_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    thermal_slowdown: bool = False
    power_slowdown: bool = False
    nvlink_down: tuple[int, ...] = ()
    unreadable: str | None = None  # the GPU is there (or was) but NVML cannot read it
    fabric: str | None = None  # Fabric Manager state/status when not completed/success
    mig_pending: bool = False  # MIG mode change waits for a GPU reset
    idle: bool = False  # clocks idle: a lower PCIe generation is power saving, not a fault
    pcie_gen: tuple[int, int] | None = None  # (current, max)
    pcie_width: tuple[int, int] | None = None  # (current, max)
    pcie_replays: int | None = None  # cumulative PCIe replay counter
    # Cumulative NVLink error totals over all links: (name, count), e.g. ("crc", 12).
    nvlink_errors: tuple[tuple[str, int], ...] = ()
    recovery_action: int | None = None  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; None: unknown
    inforom_corrupt: bool | None = None  # nvmlDeviceValidateInforom failed with CorruptedInforom
    ecc_mode: tuple[int, int] | None = None  # (current, pending), NVML_FEATURE_* values
    temperature: tuple[int, int] | None = None  # (GPU celsius, its slowdown threshold)
    hbm_temperature: tuple[int, int] | None = None  # (memory celsius, its maximum)
    hw_slowdown: bool = False  # the HW_SLOWDOWN clock event reason bit
    # On an NVSwitch board: (NVSwitches reached through active links now, expected).
    nvswitches: tuple[int, int] | None = None
    nvswitches_missing: tuple[str, ...] = ()  # PCI ids of switches reached before, not now
    fabric_health: tuple[int, int | None] | None = None  # (healthMask, healthSummary)


class XidEvent(msgspec.Struct, frozen=True):
    uuid: str
    xid: int
    at: float


class NicReading(msgspec.Struct, frozen=True):
    name: str
    pci_address: str | None
    speed_mbps: int | None
    numa_node: int | None
    model: str | None
    sriov_total_vfs: int
    sriov_num_vfs: int
    vfs: tuple[str, ...]
    management: bool = False  # holds the default route, or named in configuration
    # What names the card itself, not its slot: `guid:`, `mac:` or `vpd:`
    # (agent.nic_identity); "" when nothing does.
    physical_id: str = ""


class DiskReading(msgspec.Struct, frozen=True):
    name: str
    size_bytes: int
    rotational: bool
    model: str | None
    # Stable across reboots: `wwn:<wwid>`, `serial:<serial>` or `path:<pci path>`; the
    # kernel name (`nvme0n1`) is only an attribute.
    device_id: str = ""
    boot: bool = False  # holds /, /boot or /boot/efi


class HostReading(msgspec.Struct, frozen=True):
    """What sysfs and procfs say about the host outside the GPUs."""

    vcpu: int = 0
    # (sockets, cores per socket, threads per core) from sysfs topology; None when the
    # kernel does not say or the layout is uneven.
    cpu_topology: tuple[int, int, int] | None = None
    memory_bytes: int = 0
    hugepages_1gi: int = 0
    nics: tuple[NicReading, ...] = ()
    disks: tuple[DiskReading, ...] = ()
    # NVIDIA display/3D controllers the PCI bus shows (vendor 0x10de, class 0x03xxxx).
    gpu_pci: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
