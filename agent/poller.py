"""The poll loop: every interval, read NVML and sysfs (on a worker thread, since NVML
calls block), fold in XID events, evaluate health, build the inventory, read the GPUs'
use (`agent.usage`) and its owners' host memory (`agent.cgroup_memory`), hand it on.

NICs and disks are re-read every `host_every_s` (default 60 s), GPUs and NIC link
states (`read_ports`) every poll. NVML's reading is reconciled with the PCI bus and the
expected inventory (`agent.presence`), so a GPU nobody can read is a missing, unhealthy
device. If NVML stops answering mid-run, the last known GPUs stay in the inventory
(their atoms must not vanish) while the node reports `unmonitored`.

An operator can make the agent let go of NVML (close /dev/nvidia*: the XID event set
freed, nvmlShutdown) to reset a GPU or reload the driver: `request_release()` (SIGUSR1)
or creating `release_file`. Meanwhile the node reports `unmonitored` with the reason;
`request_resume()` (SIGUSR2) and removing the file let the next poll initialise NVML
again. A release request wakes the poll loop so it takes effect at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from agent.cgroup_memory import OwnerMemoryReader
from agent.health import Finding, HealthPolicy, HealthState, evaluate
from agent.inventory import Identity, SharingRule, build_inventory
from agent.presence import reconcile
from agent.reader import NvmlReader
from agent.readings import HostReading, NicReading, NvmlSnapshot
from agent.state import AgentState
from agent.usage import UsageReader
from agent.xid_watch import XidWatcher
from shared.clock import Clock
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
        read_ports: Callable[[tuple[NicReading, ...]], Mapping[str, tuple[str, ...]]] | None = None,
        expected: Mapping[str, int] | None = None,
        offer_boot_disks: bool = False,
        offer_management_nics: bool = False,
        release_file: Path | None = None,
        usage: UsageReader | None = None,
        memory: OwnerMemoryReader | None = None,
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
        self._read_ports = read_ports
        self._expected = dict(expected or {})
        self._offer = (offer_boot_disks, offer_management_nics)
        self._release_file = release_file
        self._usage = usage
        self._memory = memory
        self._release_asked = False
        self._released: str | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.polls = 0

    @property
    def health(self) -> HealthState:
        return self._health

    @property
    def released(self) -> bool:
        return self._released is not None

    def request_release(self) -> None:
        """Let go of NVML at the next poll (now, if the loop runs); thread-safe."""
        self._release_asked = True
        self._poke()

    def request_resume(self) -> None:
        self._release_asked = False
        self._poke()

    def poll_once(self) -> AgentState:
        snap = self._read_nvml()
        host = self._host_reading()
        if snap.error is None:
            self._last_good = snap
            if self._watcher is not None:
                readable = [c.index for c in snap.counters if not c.unreadable]
                self._watcher.ensure(readable, snap.generation)
        xids = self._watcher.drain() if self._watcher is not None else ()
        now = self._clock.monotonic()
        shown = snap
        if snap.error is not None and self._last_good is not None:
            shown = msgspec.structs.replace(self._last_good, error=snap.error, counters=())
        shown = reconcile(shown, host.gpu_pci, self._expected.get("gpu", 0))
        # Rebuilding the same inventory every poll is most of the agent's CPU; readings
        # are plain values, so equality says whether anything changed.
        key = (shown.gpus, shown.driver_version, shown.cuda_version, host)
        if self._built is None or self._built[0] != key:
            built = build_inventory(
                self._ident,
                shown,
                host,
                self._sharing,
                boot_id=self._boot_id,
                sent_at=self._clock.now_ms(),
                offer_boot_disks=self._offer[0],
                offer_management_nics=self._offer[1],
                expected=self._expected,
            )
            self._built = (key, built)
        inventory = self._built[1]
        counters = shown.counters if snap.error is None else ()
        self._health = evaluate(
            self._health,
            counters,
            xids,
            now,
            self._policy,
            snap.error,
            extra=self._device_findings(inventory, host),
        )
        devices = self._health.unhealthy_devices()
        inventory = msgspec.structs.replace(inventory, health=self._health.node, devices=devices)
        use = () if self._usage is None else self._usage.read(shown.gpus, snap.error is None)
        memory = () if self._memory is None else self._memory.read(use)
        self.polls += 1
        return AgentState(inventory, self._health.node, devices, now, use, memory)

    def _read_nvml(self) -> NvmlSnapshot:
        wanted = self._release_asked or (
            self._release_file is not None and self._release_file.exists()
        )
        if wanted and self._released is None:
            how = "SIGUSR1" if self._release_asked else str(self._release_file)
            self._released = f"NVML released for maintenance ({how})"
            if self._watcher is not None:
                self._watcher.stop()
            self._reader.close()
            log.warning(
                "%s: /dev/nvidia* closed; GPUs may be reset or the driver reloaded", self._released
            )
        elif not wanted and self._released is not None:
            log.warning("NVML release ended: initialising NVML again")
            self._released = None
        if self._released is not None:
            return NvmlSnapshot(error=self._released, problems=(self._released,))
        return self._reader.read()

    def _device_findings(
        self, inventory: Inventory, host: HostReading
    ) -> dict[str, tuple[Finding, ...]]:
        """Devices other than GPUs: NIC link state, placeholders for the expected
        inventory's shortfall. Every such device is listed, healthy ones with no
        findings, so their recovery goes through hysteresis."""
        out: dict[str, tuple[Finding, ...]] = {}
        ports = dict(self._read_ports(host.nics)) if self._read_ports is not None else {}
        for atom in inventory.atoms:
            if atom.cls == "nic.vf" and atom.device_id:
                why = ports.get(atom.device_id, ())
                out[atom.device_id] = tuple(("unhealthy", w) for w in why)
            missing = atom.attrs.get("missing")
            if atom.device_id.startswith("missing:") and isinstance(missing, str):
                out[atom.device_id] = (("unhealthy", f"missing: {missing}"),)
        return out

    def _host_reading(self) -> HostReading:
        """NICs and disks change rarely and sysfs walks are not free: re-read them every
        `host_every_s`, not every poll."""
        now = self._clock.monotonic()
        if self._host is None or now - self._host[0] >= self._host_every_s:
            self._host = (now, self._read_host())
        return self._host[1]

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop has closed: nothing to wake
                pass

    async def run(self, interval_s: float, sink: Callable[[AgentState], None]) -> None:
        # Polls run one at a time on a thread of their own. asyncio's default executor
        # starts another worker (its stack, its malloc arena) whenever a job comes before
        # the last worker has marked itself idle, and keeps every one it started.
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-poll")
        try:
            await self._run(interval_s, sink, pool)
        finally:
            pool.shutdown(wait=False)

    async def _run(
        self, interval_s: float, sink: Callable[[AgentState], None], pool: ThreadPoolExecutor
    ) -> None:
        loop = asyncio.get_running_loop()
        self._loop, self._wake = loop, asyncio.Event()
        next_tick = loop.time()
        while True:
            try:
                sink(await loop.run_in_executor(pool, self.poll_once))
            except Exception:  # one bad poll must not end monitoring
                log.exception("poll failed")
            next_tick += interval_s
            now = loop.time()
            if next_tick < now:  # overran: skip the missed ticks rather than burst
                next_tick = now + interval_s
            # Sleep until the next tick, or until a release/resume request wakes us.
            try:
                await asyncio.wait_for(self._wake.wait(), next_tick - now)
            except TimeoutError:
                pass
            else:
                self._wake.clear()
                next_tick = loop.time()
