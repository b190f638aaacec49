"""Listens for XID events on a thread (nvmlEventSetWait blocks) and queues them.

The poll loop drains the queue each interval. The queue is bounded: if the poll loop
is stuck, the oldest events are dropped, which loses nothing that matters for health
because any fault XID in the queue already keeps the GPU unhealthy for `xid_hold_s`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

import pynvml

from agent.clock import Clock
from agent.nvml import NvmlLike
from agent.readings import XidEvent

log = logging.getLogger(__name__)


class XidWatcher:
    def __init__(self, nvml: NvmlLike, clock: Clock, wait_ms: int = 1000, keep: int = 1024):
        self._nvml = nvml
        self._clock = clock
        self._wait_ms = wait_ms
        self._events: deque[XidEvent] = deque(maxlen=keep)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, gpu_count: int) -> bool:
        """Register every GPU for XID events and start the thread; False if NVML refuses."""
        if self.running:
            return True
        try:
            self._set = self._nvml.nvmlEventSetCreate()
        except Exception as exc:
            log.warning("xid events unavailable: %s", exc)
            return False
        registered = 0
        for index in range(gpu_count):
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                self._nvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, self._set
                )
                registered += 1
            except Exception as exc:
                log.warning("gpu %d: xid events unavailable: %s", index, exc)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="agent-xid", daemon=True)
        self._thread.start()
        log.info("listening for xid events on %d of %d gpus", registered, gpu_count)
        return True

    def drain(self) -> tuple[XidEvent, ...]:
        out: list[XidEvent] = []
        while True:
            try:
                out.append(self._events.popleft())
            except IndexError:
                return tuple(out)

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self._wait_ms / 1000 + 2)
        if self._set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._set)
            except Exception as exc:
                log.debug("nvmlEventSetFree failed: %s", exc)
            self._set = None

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                data = self._nvml.nvmlEventSetWait(self._set, self._wait_ms)
            except pynvml.NVMLError_Timeout:
                continue
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.warning("xid event wait failed: %s", exc)
                # Back off so a broken driver does not spin a core.
                self._stop.wait(min(5.0, 0.1 * failures))
                continue
            failures = 0
            if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                uuid = str(self._nvml.nvmlDeviceGetUUID(data.device))
            except Exception:
                uuid = "unknown"
            event = XidEvent(uuid=uuid, xid=int(data.eventData), at=self._clock.monotonic())
            log.warning("xid %d on %s", event.xid, uuid)
            self._events.append(event)
