"""The poll loop: every interval, read NVML and sysfs (on a worker thread, since NVML
calls block), fold in XID events, evaluate health, build the inventory, hand it on.

NICs and disks are re-read every `host_every_s` (default 60 s), GPUs every poll. If
NVML stops answering mid-run, the last known GPUs stay in the inventory (their atoms
must not vanish) while the node reports `unmonitored`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

from agent.clock import Clock
from agent.health import HealthPolicy, HealthState, evaluate
from agent.inventory import Identity, SharingRule, build_inventory
from agent.reader import NvmlReader
from agent.readings import HostReading, NvmlSnapshot
from agent.state import AgentState
from agent.xid_watch import XidWatcher
from shared.wire import Inventory

log = logging.getLogger(__name__)


class Poller:
    def __init__(
        self,
        *,
        reader: NvmlReader,
        read_host: Callable[[], HostReading],
        ident: Identity,
        clock: Clock,
        boot_id: str,
        policy: HealthPolicy | None = None,
        sharing: tuple[SharingRule, ...] = (),
        watcher: XidWatcher | None = None,
        host_every_s: float = 60.0,
    ) -> None:
        self._reader = reader
        self._read_host = read_host
        self._ident = ident
        self._clock = clock
        self._boot_id = boot_id
        self._policy = policy or HealthPolicy()
        self._sharing = sharing
        self._watcher = watcher
        self._health = HealthState()
        self._last_good: NvmlSnapshot | None = None
        self._host_every_s = host_every_s
        self._host: tuple[float, HostReading] | None = None
        self._built: tuple[object, Inventory] | None = None
        self.polls = 0

    @property
    def health(self) -> HealthState:
        return self._health

    def poll_once(self) -> AgentState:
        snap = self._reader.read()
        if snap.error is None:
            self._last_good = snap
            if self._watcher is not None and not self._watcher.running:
                self._watcher.start(len(snap.gpus))
        host = self._host_reading()
        xids = self._watcher.drain() if self._watcher is not None else ()
        now = self._clock.monotonic()
        self._health = evaluate(self._health, snap.counters, xids, now, self._policy, snap.error)
        shown = snap
        if snap.error is not None and self._last_good is not None:
            shown = replace(self._last_good, error=snap.error, counters=())
        devices = self._health.unhealthy_devices()
        # Rebuilding the same inventory every poll is most of the agent's CPU; readings
        # are plain values, so equality says whether anything changed.
        key = (shown.gpus, shown.driver_version, shown.cuda_version, host)
        if self._built is not None and self._built[0] == key:
            inventory = self._built[1].model_copy(
                update={"health": self._health.node, "devices": devices}
            )
        else:
            inventory = build_inventory(
                self._ident,
                shown,
                host,
                self._sharing,
                boot_id=self._boot_id,
                sent_at=self._clock.wall_ms(),
                health=self._health.node,
                devices=devices,
            )
            self._built = (key, inventory)
        self.polls += 1
        return AgentState(inventory, self._health.node, devices, now)

    def _host_reading(self) -> HostReading:
        """NICs and disks change rarely and sysfs walks are not free: re-read them every
        `host_every_s`, not every poll."""
        now = self._clock.monotonic()
        if self._host is None or now - self._host[0] >= self._host_every_s:
            self._host = (now, self._read_host())
        return self._host[1]

    async def run(self, interval_s: float, sink: Callable[[AgentState], None]) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            try:
                sink(await asyncio.to_thread(self.poll_once))
            except Exception:  # one bad poll must not end monitoring
                log.exception("poll failed")
            next_tick += interval_s
            now = loop.time()
            if next_tick < now:  # overran: skip the missed ticks rather than burst
                next_tick = now + interval_s
            await asyncio.sleep(next_tick - now)
