"""XID events of the simulated NVML: each `xid` entry of the fault file is delivered once
while it stays in the file (removed and added again, it fires again), to the event sets
its GPU is registered in; a reset-class XID sets the GPU's recovery action (79: node
reboot, else GPU reset) in the map the simulated NVML reads its field values from.
Thread-safe: the XID thread waits while the poll thread registers and frees.
"""

from __future__ import annotations

import threading

import pynvml

from agent.sim.devices import RESET_CLASSES, SimEvent, SimEventSet, SimGpu
from agent.sim.faults import Faults
from agent.xid import CATALOGUE


class XidDelivery:
    def __init__(self, gpus: list[SimGpu], recovery: dict[int, int]) -> None:
        self._gpus = gpus
        self._recovery = recovery  # physical GPU -> pending recovery action (shared)
        self._delivered: set[str] = set()
        self._lock = threading.Lock()

    def register(self, event_set: SimEventSet, gpu: int) -> None:
        with self._lock:
            event_set.gpus.add(gpu)

    def free(self, event_set: SimEventSet) -> None:
        with self._lock:
            event_set.gpus.clear()

    def next(self, faults: Faults, event_set: SimEventSet) -> SimEvent | None:
        """The next XID not yet delivered on a GPU of `event_set`, or None."""
        with self._lock:
            present = {f.key for f in faults.on("xid")}
            self._delivered &= present  # a removed entry may fire again when re-added
            for fault in faults.on("xid"):
                if fault.key in self._delivered or fault.gpu not in event_set.gpus:
                    continue
                if fault.gpu is None or not 0 <= fault.gpu < len(self._gpus):
                    continue
                self._delivered.add(fault.key)
                if CATALOGUE.get(fault.xid, ("other", ""))[0] in RESET_CLASSES:
                    action = (
                        pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
                        if fault.xid == 79
                        else pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
                    )
                    self._recovery[fault.gpu] = max(self._recovery.get(fault.gpu, 0), action)
                return SimEvent(
                    device=self._gpus[fault.gpu],
                    eventType=int(pynvml.nvmlEventTypeXidCriticalError),
                    eventData=fault.xid,
                )
        return None
