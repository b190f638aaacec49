"""Listens for XID events on a thread (nvmlEventSetWait blocks) and queues them.

The poll loop drains the queue each interval. The queue is bounded: if the poll loop
is stuck, the oldest events are dropped, which loses little that matters for health
because a reset-class XID already holds the GPU until a reset.

GPUs are registered by their real NVML indices (with GPU 3 unreadable, GPU 7 is still
heard), GPUs that become readable later are added, and after NVML re-initialises (a
new session: `generation` changed) the old event set is dead, so it is freed and a new
one is created and registered. Each GPU's UUID is noted when it is registered, so an
event whose UUID can no longer be read (a GPU in trouble) is still filed under its GPU
through `nvmlDeviceGetIndex`; only when that fails too is it filed under `unknown`
(which health keeps at node level). `stop` lets go of the event set, as releasing NVML
for a GPU reset or driver reload needs.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

import pynvml

from agent.nvml import NvmlLike
from agent.readings import XidEvent
from shared.clock import Clock

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
        self._generation: int | None = None
        self._registered: set[int] = set()
        self._uuids: dict[int, str] = {}  # by NVML index, noted when registered

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def registered(self) -> frozenset[int]:
        return frozenset(self._registered)

    def ensure(self, indices: Iterable[int], generation: int = 0) -> bool:
        """Listen on these GPU indices in this NVML session: start, re-create after a
        re-initialisation, or register GPUs that became readable. False if NVML refuses."""
        wanted = set(indices)
        if self.running and generation == self._generation:
            self._register(wanted - self._registered)
            return True
        self.stop()
        try:
            self._set = self._nvml.nvmlEventSetCreate()
        except Exception as exc:
            log.warning("xid events unavailable: %s", exc)
            return False
        self._generation = generation
        self._registered = set()
        self._register(wanted)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="agent-xid", daemon=True)
        self._thread.start()
        log.info("listening for xid events on gpus %s", sorted(self._registered))
        return True

    def start(self, indices: Iterable[int], generation: int = 0) -> bool:
        return self.ensure(indices, generation)

    def _register(self, indices: Iterable[int]) -> None:
        for index in sorted(indices):
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                self._nvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, self._set
                )
            except Exception as exc:
                log.warning("gpu %d: xid events unavailable: %s", index, exc)
                continue
            self._registered.add(index)
            try:
                # Copy on write: the XID thread reads this map.
                self._uuids = {**self._uuids, index: str(self._nvml.nvmlDeviceGetUUID(handle))}
            except Exception as exc:
                log.debug("gpu %d: uuid unreadable at registration: %s", index, exc)

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
        self._registered = set()
        self._uuids = {}
        self._generation = None

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
            uuid = self._uuid_of(data.device)
            event = XidEvent(uuid=uuid, xid=int(data.eventData), at=self._clock.monotonic())
            log.warning("xid %d on %s", event.xid, uuid)
            self._events.append(event)

    def _uuid_of(self, device: Any) -> str:
        try:
            return str(self._nvml.nvmlDeviceGetUUID(device))
        except Exception as exc:
            log.debug("xid event: uuid unreadable: %s", exc)
        try:
            return self._uuids.get(int(self._nvml.nvmlDeviceGetIndex(device)), "unknown")
        except Exception as exc:
            log.debug("xid event: index unreadable: %s", exc)
        return "unknown"
