"""Fault injection for the simulated NVML: a JSON file re-read whenever it changes.

The file holds `{"faults": [...]}`; each entry is an object with a `kind`:

- `{"kind": "xid", "gpu": 3, "xid": 79}` — one XID event, delivered once while the entry
  stays in the file (remove it and add it again to fire again);
- `{"kind": "dbe", "gpu": 1, "count": 2}` — volatile double-bit ECC errors;
- `{"kind": "lost", "gpu": 2}` — every call on that GPU raises NVML_ERROR_GPU_IS_LOST;
- `{"kind": "nvlink_down", "gpu": 0, "link": 3}` — one link inactive (no `link`: all);
- `{"kind": "thermal", "gpu": 4}` / `{"kind": "power", "gpu": 4}` — clock slowdown;
- `{"kind": "retired_pending", "gpu": 5}`, `{"kind": "remap_pending", "gpu": 5}`,
  `{"kind": "remap_failure", "gpu": 5}` — memory retirement conditions;
- `{"kind": "nvml_down"}` — NVML stops answering (driver unloaded);
- `{"kind": "handle_error", "gpu": 3, "error": "unknown"}` — getting the GPU's handle
  fails with NVML_ERROR_UNKNOWN (`no_permission`, `function_not_found`, `gpu_is_lost`,
  `not_found` … any `NVML_ERROR_*` name in lower case);
- `{"kind": "absent", "gpu": 3}` — NVML does not enumerate the GPU at all (the driver
  failed to initialise it) although the PCI bus still shows it; later GPUs move down;
- `{"kind": "fabric", "state": 1, "status": 0}` — Fabric Manager state (NVML codes:
  1 not started, 2 in progress, 3 completed) and status (an nvmlReturn_t); no `gpu`: all;
- `{"kind": "pcie", "gpu": 1, "gen": 3, "width": 8}` — the link trained below its maximum;
- `{"kind": "pcie_replay", "gpu": 1, "count": 500}` — the cumulative PCIe replay counter;
- `{"kind": "nvlink_crc" | "nvlink_replay" | "nvlink_recovery", "gpu": 1, "count": 9}` —
  cumulative NVLink error totals;
- `{"kind": "mig_pending", "gpu": 2}` — a MIG mode change waits for a GPU reset;
- `{"kind": "reset", "gpu": 3}` — an operator reset the GPU: the recovery action a
  reset-class XID set goes back to NONE;
- `{"kind": "port_down", "nic": "ibp0s0"}` — the NIC's netdev and InfiniBand port are down
  (applied to the fake sysfs tree by `agent.sim.sysfs_tree.FaultedPorts`);
- `{"kind": "inforom", "gpu": 1}` — nvmlDeviceValidateInforom fails (corrupted InfoROM);
- `{"kind": "ecc_pending", "gpu": 1}` — ECC mode: enabled now, disabled at the next reset;
- `{"kind": "temp", "gpu": 1, "celsius": 91, "sensor": "gpu" | "hbm"}` — a temperature;
- `{"kind": "hw_slowdown", "gpu": 1}` — the HW_SLOWDOWN clock event reason bit;
- `{"kind": "nvswitch_down", "switch": 2}` — the profile's NVSwitch 2 is gone: every link
  wired to it (link % switches == 2) is inactive on every GPU;
- `{"kind": "retired", "gpu": 0, "count": 61}` — pages retired for multiple single-bit
  errors (GPUs before Ampere; later ones remap rows instead);
- `{"kind": "process", "pid": 4242, "gpus": [0, 1], "memory_mib": 20480, "env": {…},
  "cgroup": "0::/…", "util": {"shape": "constant", "level": 80}}` — a workload: a compute
  process on those GPUs (`mig`: on that MIG slot of each) with its environment, cgroup and
  utilization curve (`agent.sim.workload` describes the fields and shapes);
- `fabric` also takes `"mask"` (nvmlGpuFabricInfo's healthMask) and `"summary"`
  (healthSummary: 1 healthy, 2 unhealthy, 3 limited capacity).

Clearing is writing the file without the entry (`{"faults": []}` clears everything).
A file that is missing or not valid JSON counts as no faults, and is logged, never fatal.
Write it atomically (write a temporary file, then rename), as `write_faults` does.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Literal, get_args

import msgspec

from agent.errors import AgentError
from agent.sim.workload import Workload, WorkloadError, parse_workload

log = logging.getLogger(__name__)

FaultKind = Literal[
    "xid",
    "dbe",
    "lost",
    "nvlink_down",
    "thermal",
    "power",
    "retired_pending",
    "remap_pending",
    "remap_failure",
    "nvml_down",
    "handle_error",
    "absent",
    "fabric",
    "pcie",
    "pcie_replay",
    "nvlink_crc",
    "nvlink_replay",
    "nvlink_recovery",
    "mig_pending",
    "reset",
    "port_down",
    "inforom",
    "ecc_pending",
    "temp",
    "hw_slowdown",
    "nvswitch_down",
    "retired",
    "process",
]
_NO_GPU = ("nvml_down", "fabric", "port_down", "nvswitch_down", "process")
_INT_FIELDS = (
    "gpu",
    "xid",
    "link",
    "count",
    "state",
    "status",
    "gen",
    "width",
    "celsius",
    "switch",
    "mask",
    "summary",
)
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)


class Fault(msgspec.Struct, frozen=True):
    kind: str
    gpu: int | None = None
    xid: int = 0
    link: int | None = None
    count: int = 1
    key: str = ""  # identifies one XID entry so it is delivered once
    error: str = ""
    nic: str = ""
    state: int | None = None
    status: int = 0
    gen: int | None = None
    width: int | None = None
    celsius: int = 0
    sensor: str = "gpu"
    switch: int | None = None
    mask: int | None = None
    summary: int | None = None
    workload: Workload | None = None  # `process` entries


class Faults(msgspec.Struct, frozen=True):
    items: tuple[Fault, ...] = ()

    def on(self, kind: str, gpu: int | None = None) -> tuple[Fault, ...]:
        return tuple(f for f in self.items if f.kind == kind and (gpu is None or f.gpu == gpu))

    def has(self, kind: str, gpu: int | None = None) -> bool:
        return bool(self.on(kind, gpu))


class FaultError(AgentError, ValueError):
    pass


def parse_faults(data: Any) -> Faults:
    if not isinstance(data, dict) or not isinstance(data.get("faults", []), list):
        raise FaultError('expected {"faults": [...]}')
    seen: dict[str, int] = {}
    items: list[Fault] = []
    for i, entry in enumerate(data.get("faults", [])):
        if not isinstance(entry, dict) or entry.get("kind") not in FAULT_KINDS:
            raise FaultError(f"faults[{i}]: kind must be one of {', '.join(FAULT_KINDS)}")
        for field in _INT_FIELDS:
            value = entry.get(field)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise FaultError(f"faults[{i}].{field}: expected an integer")
        for field in ("error", "nic", "sensor"):
            value = entry.get(field)
            if value is not None and not isinstance(value, str):
                raise FaultError(f"faults[{i}].{field}: expected a string")
        kind = str(entry["kind"])
        workload = None
        if kind == "process":
            try:
                workload = parse_workload(entry, f"faults[{i}]")
            except WorkloadError as exc:
                raise FaultError(str(exc)) from None
        if kind not in _NO_GPU and entry.get("gpu") is None:
            raise FaultError(f"faults[{i}].gpu: required for {kind}")
        if kind == "xid" and entry.get("xid") is None:
            raise FaultError(f"faults[{i}].xid: required for xid")
        if kind == "handle_error" and not entry.get("error"):
            raise FaultError(f"faults[{i}].error: required for handle_error")
        if kind == "port_down" and not entry.get("nic"):
            raise FaultError(f"faults[{i}].nic: required for port_down")
        if kind == "fabric" and entry.get("state") is None:
            raise FaultError(f"faults[{i}].state: required for fabric")
        if kind == "temp" and entry.get("celsius") is None:
            raise FaultError(f"faults[{i}].celsius: required for temp")
        if kind == "temp" and entry.get("sensor", "gpu") not in ("gpu", "hbm"):
            raise FaultError(f"faults[{i}].sensor: gpu or hbm")
        if kind == "nvswitch_down" and entry.get("switch") is None:
            raise FaultError(f"faults[{i}].switch: required for nvswitch_down")
        text = json.dumps(entry, sort_keys=True)
        seen[text] = seen.get(text, 0) + 1
        items.append(
            Fault(
                kind=kind,
                gpu=entry.get("gpu"),
                xid=int(entry.get("xid") or 0),
                link=entry.get("link"),
                count=int(entry.get("count") or 1),
                key=f"{text}#{seen[text]}",
                error=str(entry.get("error") or ""),
                nic=str(entry.get("nic") or ""),
                state=entry.get("state"),
                status=int(entry.get("status") or 0),
                gen=entry.get("gen"),
                width=entry.get("width"),
                celsius=int(entry.get("celsius") or 0),
                sensor=str(entry.get("sensor") or "gpu"),
                switch=entry.get("switch"),
                mask=entry.get("mask"),
                summary=entry.get("summary"),
                workload=workload,
            )
        )
    return Faults(tuple(items))


class FaultFile:
    """The current faults from one file, re-parsed only when its mtime or size changes.
    Thread-safe: the poll thread and the XID thread both read it."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._stamp: tuple[int, int, int] | None = None
        self._faults = Faults()
        self._lock = threading.Lock()

    @property
    def watching(self) -> bool:
        return self._path is not None

    def current(self) -> Faults:
        if self._path is None:
            return self._faults
        with self._lock:
            try:
                st = os.stat(self._path)
                # The inode changes on every atomic replace, even within one mtime tick.
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            except FileNotFoundError:
                stamp = (0, -1, 0)
            if stamp != self._stamp:
                self._stamp = stamp
                self._faults = self._load(stamp)
            return self._faults

    def _load(self, stamp: tuple[int, int, int]) -> Faults:
        if stamp[1] < 0 or self._path is None:
            return Faults()
        try:
            faults = parse_faults(json.loads(self._path.read_text() or "{}"))
        except (OSError, ValueError) as exc:
            log.warning("fault file %s ignored: %s", self._path, exc)
            return Faults()
        log.info("fault file %s: %d fault(s)", self._path, len(faults.items))
        return faults


def write_faults(path: Path, faults: list[dict[str, Any]]) -> None:
    """Replace the fault file atomically, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"faults": faults}))
    os.replace(tmp, path)
