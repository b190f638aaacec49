"""NVLink, NVSwitch and fabric state of one GPU through NVML, and what it should be.

NVLink is judged against the links the GPU should have, not only links seen to drop: on
boards where every link is wired by design (SXM/HGX, a model in `SXM_NVLINKS` or named
`SXM`) the expected count is NVML's `NVML_FI_DEV_NVLINK_LINK_COUNT`, else the model's
count from `SXM_NVLINKS`, so a link already down when the agent starts, or every link
down, is `nvlink_down`. Other cards (PCIe with bridges wire only some links) are judged
against the links ever seen active. Either way a link going down shows as a health
problem rather than as a smaller inventory.

A switch reached before and not now, and Fabric Manager's state (on NVSwitch systems CUDA
is unusable until it has configured the fabric) are read here too. Every failed call but
a lost GPU (`GpuLost`, which ends the GPU's read) leaves its value unknown.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import pynvml

from agent.nvml import NvmlLike
from agent.nvml_errors import describe, field_int, raise_if_lost, return_name
from shared.ids import normalize_pci

log = logging.getLogger(__name__)

# NVLinks per GPU on boards that wire every link (HGX/DGX baseboards), by NVML name; the
# fallback where the driver lacks NVML_FI_DEV_NVLINK_LINK_COUNT.
SXM_NVLINKS: dict[str, int] = {
    "Tesla V100-SXM2-16GB": 6,
    "Tesla V100-SXM2-32GB": 6,
    "NVIDIA A100-SXM4-40GB": 12,
    "NVIDIA A100-SXM4-80GB": 12,
    "NVIDIA H100 80GB HBM3": 18,
    "NVIDIA H200": 18,
    "NVIDIA B200": 18,
}
# NVSwitches on an 8-GPU HGX baseboard, by GPU model: every GPU has links to each.
HGX_NVSWITCHES: dict[str, int] = {
    "NVIDIA A100-SXM4-40GB": 6,
    "NVIDIA A100-SXM4-80GB": 6,
    "NVIDIA H100 80GB HBM3": 4,
    "NVIDIA H200": 4,
}
_SWITCH = int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)


class LinkReader:
    """What it learns of each GPU (its links, their far ends, the switches reached) it
    keeps by UUID for the life of the agent, as the NvmlReader that owns it does."""

    def __init__(
        self,
        nvml: NvmlLike,
        nvlinks: dict[str, int] | None = None,
        nvswitches: dict[str, int] | None = None,
    ) -> None:
        self._nvml = nvml
        self._nvlink_models = {**SXM_NVLINKS, **(nvlinks or {})}
        self._switch_models = {**HGX_NVSWITCHES, **(nvswitches or {})}
        self._links: dict[str, tuple[int, ...]] = {}
        self._expected_links: dict[str, int | None] = {}  # None: judge by links seen active
        self._ever_active: dict[str, set[int]] = {}
        self._remotes: dict[str, dict[int, str]] = {}
        self._remote_types: dict[str, dict[int, int]] = {}
        self._switches_seen: dict[str, set[str]] = {}
        self._fabric_form = 0  # the newest fabric info form the driver answered (see below)

    def has_nvlink(self, uuid: str) -> bool:
        return bool(self._links.get(uuid))

    def nvlinks(
        self, uuid: str, name: str, handle: Any
    ) -> tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...]]:
        """(active links, remote PCI ids, down links)."""
        n = self._nvml
        links = self._links.get(uuid)
        if links is None:
            # Links are numbered from 0; the first link that is not supported ends the list.
            found: list[int] = []
            for link in range(int(pynvml.NVML_NVLINK_MAX_LINKS)):
                try:
                    n.nvmlDeviceGetNvLinkState(handle, link)
                except pynvml.NVMLError as exc:
                    raise_if_lost(exc)
                    break
                found.append(link)
            links = self._links[uuid] = tuple(found)
            self._expected_links[uuid] = self._expected(name, handle)
        active: list[int] = []
        for link in links:
            try:
                if int(n.nvmlDeviceGetNvLinkState(handle, link)) == 1:
                    active.append(link)
            except pynvml.NVMLError as exc:
                raise_if_lost(exc)
        ever = self._ever_active.setdefault(uuid, set())
        remotes = self._remotes.setdefault(uuid, {})
        kinds = self._remote_types.setdefault(uuid, {})
        for link in active:
            if link not in remotes:
                try:
                    pci = n.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                    remotes[link] = normalize_pci(pci.busId)
                except pynvml.NVMLError as exc:
                    raise_if_lost(exc)
            if link not in kinds:
                try:
                    kinds[link] = int(n.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
                except pynvml.NVMLError as exc:
                    raise_if_lost(exc)
                    kinds[link] = -1  # unknown: asked once, not every poll
                except Exception:
                    kinds[link] = -1
        ever.update(active)
        expected = self._expected_links.get(uuid)
        wired = set(range(max(expected, len(links)))) if expected is not None else ever
        down = tuple(sorted(wired - set(active)))
        return tuple(active), tuple(sorted(set(remotes.values()))), down

    def nvswitches(
        self, uuid: str, name: str, active: tuple[int, ...]
    ) -> tuple[tuple[int, int] | None, tuple[str, ...]]:
        """((NVSwitches reached now, expected), switches reached before but not now), or
        (None, ()) off an NVSwitch board. Expected: the HGX board's count for this model,
        and never fewer than were ever reached, so a switch gone before the agent started
        shows too."""
        kinds = self._remote_types.get(uuid, {})
        remotes = self._remotes.get(uuid, {})
        now = {remotes[k] for k in active if kinds.get(k) == _SWITCH and k in remotes}
        seen = self._switches_seen.setdefault(uuid, set())
        seen.update(now)
        if not seen:
            return None, ()
        expected = max(self._switch_models.get(name, 0), len(seen))
        return (len(now), expected), tuple(sorted(seen - now))

    def _expected(self, name: str, handle: Any) -> int | None:
        """Links this GPU must have active; None where the board may leave links unwired."""
        known = self._nvlink_models.get(name)
        if known is None and "SXM" not in name:
            return None
        try:
            (value,) = self._nvml.nvmlDeviceGetFieldValues(
                handle, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT]
            )
            if int(value.nvmlReturn) == 0 and field_int(value) > 0:
                return field_int(value)
        except pynvml.NVMLError as exc:
            raise_if_lost(exc)
        except Exception as exc:  # a broken binding: the model table still knows
            log.debug("nvlink link count: %s", describe(exc))
        return known

    def fabric(self, handle: Any) -> tuple[str | None, str | None, tuple[int, int | None] | None]:
        """(fabric clique, problem, (healthMask, healthSummary)). HGX boards with NVSwitches
        and NVLink-fabric systems (GH200/GB200 NVL) answer; on NVSwitch systems CUDA is
        unusable until Fabric Manager has configured the fabric, so anything but
        completed/success is a problem. The health mask needs the versioned call
        (nvmlDeviceGetGpuFabricInfoV); older drivers answer only the plain one."""
        info = self._fabric_info(handle)
        if info is None:
            return None, None, None  # no fabric on this board (PCIe cards, older drivers)
        state = int(info.state)
        if state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            return None, None, None
        mask = getattr(info, "healthMask", None)
        summary = getattr(info, "healthSummary", None)
        health = None if mask is None else (int(mask), None if summary is None else int(summary))
        if state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
            words = {
                pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not started",
                pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in progress",
            }
            return None, f"fabric manager: state {words.get(state, state)}", health
        if int(info.status) != 0:
            return None, f"fabric manager: status {return_name(int(info.status))}", health
        cluster = bytes(info.clusterUuid)
        if not any(cluster):
            return None, None, health
        return f"{cluster.hex()}/{int(info.cliqueId)}", None, health

    def _fabric_info(self, handle: Any) -> Any | None:
        """The newest fabric info struct the driver fills, remembering which that was; a
        binding or driver without a form (no such struct or function, a version it does
        not know) moves on to the next older one."""
        n = self._nvml
        forms = (
            ("c_nvmlGpuFabricInfo_v3_t", "nvmlDeviceGetGpuFabricInfoV"),
            ("c_nvmlGpuFabricInfo_v2_t", "nvmlDeviceGetGpuFabricInfoV"),
            ("c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo"),
        )
        older = (pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        for k in range(self._fabric_form, len(forms)):
            make, call = getattr(pynvml, forms[k][0], None), getattr(n, forms[k][1], None)
            if make is None or call is None:
                continue
            info = make()
            try:
                # A pointer, not byref: the same to the driver, and a simulated NVML reads
                # the struct through the public `.contents`.
                call(handle, ctypes.pointer(info))
            except pynvml.NVMLError as exc:
                raise_if_lost(exc)
                if exc.value in older:
                    continue
                return None  # not supported (no fabric on this board), or not now
            except Exception as exc:  # a broken binding: try the older form
                log.debug("fabric info %s: %s", forms[k][0], describe(exc))
                continue
            self._fabric_form = k
            return info
        return None
