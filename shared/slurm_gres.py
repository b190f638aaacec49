"""Slurm's gres devices for one node's GPUs, in Slurm's index order: what `gpufleet slurm
conf` writes as gres.conf lines and what the TaskProlog (`gpufleet-agent gres-uuids`)
maps Slurm's gres indexes back to device UUIDs by. One function for both, so the two
cannot disagree.

Slurm (22.05, checked on Debian's) numbers a node's `gpu` gres by type, the types
sorted by name as the node line's `Gres=` lists them (`a100`, `a100_1g.10gb`,
`a100_2g.20gb`, …), and within a type in gres.conf order. Without its NVML AutoDetect
plugin it puts those indexes in a job's CUDA_VISIBLE_DEVICES (`--gres=gpu:a100_1g.10gb:2`
on the demo's A100 host → `6,7`), which CUDA would read as whole GPUs 6 and 7.
`gres_devices` lists the devices in exactly that order, and `slurm conf` writes the
lines in it, so position in the list = line in gres.conf = Slurm's index.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

# Words in NVML's model names that say nothing about the GPU (NVIDIA H100 80GB HBM3).
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro"})
_SERIES_WORDS = frozenset({"rtx", "gtx"})
_NOT_TOKEN = re.compile(r"[^A-Za-z0-9_.-]+")


def token(text: str) -> str:
    """A word Slurm takes in Features=, Type= and switch names."""
    return _NOT_TOKEN.sub("-", text.strip()).strip("-") or "unnamed"


def short_model(name: str) -> str:
    """NVML's model name as a gres type: `NVIDIA H100 80GB HBM3` → h100,
    `NVIDIA A100-SXM4-80GB` → a100, `NVIDIA GeForce RTX 4090` → rtx4090."""
    words = [w for w in re.split(r"[\s_-]+", name.lower()) if w and w not in _VENDOR_WORDS]
    if not words:
        return "gpu"
    first = words[0]
    if first in _SERIES_WORDS and len(words) > 1:
        first += words[1]
    return token(first).lower()


class GresMig(msgspec.Struct, frozen=True):
    """One MIG instance of a GPU, as its inventory names it."""

    profile: str
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str = ""


class GresGpu(msgspec.Struct, frozen=True):
    """One GPU as its inventory names it; `missing`: NVML cannot read it (left out)."""

    index: int
    name: str
    uuid: str = ""
    mig_enabled: bool = False
    migs: tuple[GresMig, ...] = ()
    missing: bool = False


class GresDevice(msgspec.Struct, frozen=True):
    """One gres.conf line: a whole GPU (`mig` None) or one MIG instance of it."""

    gres_type: str
    gpu: GresGpu
    mig: GresMig | None = None

    @property
    def uuid(self) -> str:
        """What CUDA_VISIBLE_DEVICES names this device by (a GPU or MIG UUID)."""
        return self.mig.uuid if self.mig is not None else self.gpu.uuid


def gres_devices(gpus: Iterable[GresGpu]) -> list[GresDevice]:
    """The node's gres devices in Slurm's index order (see the module's docstring):
    readable GPUs only; a MIG-enabled GPU as its instances, a whole GPU as itself."""
    out: list[GresDevice] = []
    for gpu in sorted((g for g in gpus if not g.missing), key=lambda g: g.index):
        model = short_model(gpu.name)
        if not gpu.mig_enabled:
            out.append(GresDevice(model, gpu))
            continue
        for mig in sorted(gpu.migs, key=lambda m: (m.gpu_instance_id, m.compute_instance_id)):
            out.append(GresDevice(f"{model}_{token(mig.profile).lower()}", gpu, mig))
    # A stable sort: by type as Slurm numbers them, in GPU and instance order within one.
    return sorted(out, key=lambda d: d.gres_type)


class GresIndexError(ValueError):
    """A gres index list that does not fit the node's devices."""


def uuids_for(gpus: Iterable[GresGpu], indexes: str) -> list[str]:
    """Slurm's gres indexes (`6,7`, as in CUDA_VISIBLE_DEVICES or SLURM_STEP_GPUS) as
    the devices' UUIDs, in the order given. GresIndexError for anything else: a word
    that is not an index, an index past the node's devices, a device with no UUID."""
    devices = gres_devices(gpus)
    out: list[str] = []
    for part in indexes.split(","):
        part = part.strip()
        if not part.isdigit():
            raise GresIndexError(f"not a gres index: {part!r}")
        at = int(part)
        if at >= len(devices):
            raise GresIndexError(f"gres index {at} past this node's {len(devices)} GPU devices")
        if not devices[at].uuid:
            raise GresIndexError(f"gres index {at} has no UUID in the inventory")
        out.append(devices[at].uuid)
    return out
