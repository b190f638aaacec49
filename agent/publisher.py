"""The agent's NATS side (the only module that speaks NATS): inventory, heartbeats, use.

The poller hands over its latest `AgentState` with `update()`, which never blocks; this
module's own task publishes it. Inventory goes out at start, whenever its hash changes,
after every reconnect and when the coordinator asks on the inventory-request subject
(answered on the reply subject too when the request has one). Heartbeats go out every
interval on their own timer, and at once when health changes.

Use rides in heartbeats as changes (`agent.use_changes`): each heartbeat carries what
changed since the version the last one carried, within the heartbeat's byte budget;
more than that goes first as a full `UseReport` on the use subject, as it does when the
coordinator asks on the use-request subject (answered on the reply subject too).

While NATS is away nothing is queued: only the latest state is kept, and the next
connection gets that. Every network wait has a timeout. If polling stalls (NVML can
hang when a GPU falls off the bus), heartbeats keep flowing but report the node
`unmonitored` instead of repeating a stale "healthy".

A hung server (stopped, wedged, its host swapping) closes nothing, and the client's own
pings take tens of seconds to notice, longer than the coordinator waits before marking
the node unreachable. So the link is probed with the probe every gpufleet process runs
(`procs.nats_link.LinkProbe`): a PING round trip every `LinkTiming.probe_every_s`, and
after each heartbeat; no PONG within `probe_timeout_s`, and nothing else arriving,
means the server is dead to us, and the client reconnects (`force_reconnect`) to
another server of the cluster (`ServerRotation` tries the one just left last); a PONG
late behind messages still arriving is a busy link, kept. Both times are derived from
the coordinator's detection window (misses × interval) so that the agent is heard again
within a third of it. A heartbeat counts as sent (its `seq` used up) only once the
server has answered the PING after it; one lost with a hung server is sent again, same
`seq`, on the new link.

NATS errors are never quiet: permission violations (this agent's user may not publish
or subscribe what it tries), authorization failures and failed publishes are logged at
WARNING, at most once per kind per `WARN_EVERY_S`, and counted in `bus_errors`, which
every heartbeat carries (`busErrors`).

Its `NatsSettings` say where and as whom (`procs.natsproto.configure`): the credentials
file is either a NATS JWT `.creds` file (decentralised auth) or the user/password file
that `gpufleet nats-auth` writes (`user = "…"`, `password = "…"`), read once at the first
connect (a new file takes a restart: the Ansible handler's).

The client is the agent's own (`procs.natsproto`), not nats-py: nats-py costs the agent
about 1.3 MB itself, brings `importlib.metadata` for its version, and imports aiohttp
(about 11 MB) wherever that is importable (issue 30 point 7, bench/agent_bench.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from agent.link_timing import RECONNECT_WAIT_S, LinkTiming, ServerRotation
from agent.state import AgentState
from agent.use_changes import UseChanges, UseDelta
from procs.log_throttle import LogThrottle
from procs.nats import NatsSettings, host_port
from procs.nats_link import LinkProbe
from procs.natsproto import AuthorizationError, Client, Msg
from procs.natsproto.configure import client_options
from shared.clock import Clock
from shared.subjects import Subjects
from shared.wire import (
    IDLE_UTIL_PERCENT,
    MAX_HEARTBEAT_BYTES,
    DeviceHealth,
    Heartbeat,
    NodeHealth,
    UseReport,
)

log = logging.getLogger(__name__)

# Seconds between two warnings of one kind of NATS error (the count keeps every one).
WARN_EVERY_S = 10.0


def error_kind(exc: BaseException) -> str | None:
    """The kind of a NATS client error this agent counts, None for the rest (connection
    attempts failing while a server is away: the disconnect is logged already)."""
    text = str(exc).lower()
    if isinstance(exc, AuthorizationError) or "authorization violation" in text:
        return "authorization"
    if "permissions violation" in text:
        return "permissions"
    return None


class PublisherStats(msgspec.Struct):
    heartbeats: int = 0
    inventories: int = 0
    requests: int = 0
    use_reports: int = 0  # full UseReports sent: asked for, or too large for a heartbeat
    use_requests: int = 0
    failures: int = 0
    skipped_offline: int = 0
    reconnects: int = 0
    # Probes (or heartbeats) the server did not answer in time: links taken as dead.
    dead_links: int = 0
    # Probes answered late on a link that kept delivering: kept, not taken as dead.
    late_probes: int = 0
    # NATS errors by kind (`error_kind`, and "publish"); their sum is `busErrors`.
    errors: dict[str, int] = msgspec.field(default_factory=dict)

    @property
    def bus_errors(self) -> int:
        return sum(self.errors.values())


class Publisher:
    def __init__(
        self,
        *,
        nats: NatsSettings,
        subjects: Subjects,
        pool_id: str,
        node_id: str,
        boot_id: str,
        interval_s: float,
        clock: Clock,
        misses: int = 3,
        timeout_s: float = 5.0,
        on_ready: Callable[[], None] | None = None,
        on_bookings: Callable[[bytes], None] | None = None,
        bookings_etag: Callable[[], str] = str,
        idle_util_percent: int = IDLE_UTIL_PERCENT,
        bookings_echoed: Callable[[str], None] | None = None,
    ) -> None:
        self._nats = nats
        self._subjects = subjects
        self._pool_id = pool_id
        self._node_id = node_id
        self._boot_id = boot_id
        self._interval_s = interval_s
        self.link = LinkTiming.for_window(interval_s, misses)
        self._probe = LinkProbe(log, timeout_s=self.link.probe_timeout_s)
        self._rotation = ServerRotation()
        self._throttle = LogThrottle(log, every_s=WARN_EVERY_S)
        self._clock = clock
        # Called once, after the first inventory is out: systemd's READY=1.
        self._on_ready = on_ready
        self._timeout_s = timeout_s
        # The node's bookings (agent.bookings): handed each message; its etag echoed.
        self._on_bookings = on_bookings
        self._bookings_etag = bookings_etag
        # Told the etag of each heartbeat the server has: the bookings are current then.
        self._bookings_echoed = bookings_echoed
        self._nc: Client | None = None
        self._closing = False
        self._state: AgentState | None = None
        self._wake = asyncio.Event()
        self._need_inventory = True
        self._sent_hash: str | None = None
        self._last_health: tuple[NodeHealth, tuple[DeviceHealth, ...]] | None = None
        self._next_heartbeat = 0.0
        self._seq = 0
        self._use = UseChanges(idle_util_percent=idle_util_percent)
        self.stats = PublisherStats()
        self.inv_subject = subjects.inventory(pool_id, node_id)
        self.hb_subject = subjects.heartbeat(pool_id, node_id)
        self.req_subject = subjects.inventory_request(pool_id, node_id)
        self.use_subject = subjects.use(pool_id, node_id)
        self.use_req_subject = subjects.use_request(pool_id, node_id)
        # Any pool's: after a pool move the coordinator sends on the node's new pool.
        self.bookings_subject = subjects.bookings("*", node_id)

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    @property
    def server(self) -> str:
        """host:port of the server this agent is connected to ("" when none)."""
        nc = self._nc
        return host_port(nc.connected_url) if nc is not None else ""

    @property
    def latest(self) -> AgentState | None:
        """The one state waiting to be published: there is never a backlog."""
        return self._state

    def update(self, state: AgentState) -> None:
        """Latest state wins; never blocks, whatever NATS is doing."""
        self._state = state
        self._use.observe(state.use, now=state.polled_at, memory=state.memory)
        self._wake.set()

    async def run(self) -> None:
        """Connect (retrying forever; the client reconnects by itself after that) and
        publish until cancelled."""
        nc = Client(
            client_options(
                self._nats,
                name=f"gpufleet-agent {self._node_id}",
                reconnect_time_wait_s=RECONNECT_WAIT_S,
                reconnect_to_server_handler=self._rotation,
                connect_timeout_s=max(1.0, self._timeout_s),
                # The client's own pings only back up the probe (`_watch_link`).
                ping_interval_s=10,
                max_outstanding_pings=3,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
        )
        self._nc = nc
        try:
            await nc.connect(forever=True)
            self._rotation.connected(self.server)
            log.info("connected to %s", self.server or "?")
            await nc.subscribe(self.req_subject, self._on_request)
            await nc.subscribe(self.use_req_subject, self._on_use_request)
            if self._on_bookings is not None:
                await nc.subscribe(self.bookings_subject, self._on_bookings_msg)
            loops = [
                asyncio.create_task(self._watch_link(nc), name="nats-link-probe"),
                asyncio.create_task(self._publish_loop(), name="nats-publish"),
            ]
            try:
                done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # they only end by raising
            finally:
                # Python 3.11's wait_for drops a cancellation that lands just as what it
                # waits for completes; a loop that missed its cancel still stops at its
                # next turn.
                self._closing = True
                self._wake.set()
                for task in loops:
                    task.cancel()
                await asyncio.gather(*loops, return_exceptions=True)
        finally:
            await self._close(nc)

    async def _publish_loop(self) -> None:
        while not self._closing:
            delay = max(0.0, self._next_heartbeat - self._clock.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            except TimeoutError:
                pass
            self._wake.clear()
            await self._flush()

    async def _watch_link(self, nc: Client) -> None:
        while not self._closing:
            await asyncio.sleep(self.link.probe_every_s)
            await self._probe.probe(nc)
            self._count_probes()

    async def _answered(self, nc: Client) -> bool:
        """Whether the server answers a PING in time: everything written before it has
        reached the server. When it does not and nothing else arrives, the link is taken
        as dead and the client reconnects to another server."""
        try:
            return await self._probe.answered(nc)
        finally:
            self._count_probes()

    def _count_probes(self) -> None:
        self.stats.dead_links = self._probe.failures
        self.stats.late_probes = self._probe.late

    async def _close(self, nc: Client) -> None:
        self._closing = True
        self._nc = None
        try:
            await asyncio.wait_for(nc.close(), timeout=self._timeout_s)
        except Exception as exc:  # closing must never mask the reason we are stopping
            log.debug("nats close: %s", exc)

    async def _flush(self) -> None:
        state = self._state
        now = self._clock.monotonic()
        if state is None:
            return
        if not self.connected:
            if now >= self._next_heartbeat:
                self.stats.skipped_offline += 1
                self._next_heartbeat = now + self._interval_s
            return
        if self._need_inventory or state.inventory.inventory_hash != self._sent_hash:
            await self._send_inventory(state)
        health, devices = state.health, state.devices
        if now - state.polled_at > 3 * self._interval_s:
            age = int(now - state.polled_at)
            health = NodeHealth(status="unmonitored", reasons=(f"poll stalled for {age}s",))
        if now >= self._next_heartbeat or (health, devices) != self._last_health:
            await self._send_heartbeat(state, health, devices)
            self._next_heartbeat = now + self._interval_s

    async def _send_inventory(self, state: AgentState) -> None:
        body = self._inventory_bytes(state)
        if await self._publish(self.inv_subject, body):
            self._sent_hash = state.inventory.inventory_hash
            self._need_inventory = False
            self.stats.inventories += 1
            log.info("inventory %s sent", state.inventory.inventory_hash[:12])
            if self._on_ready is not None:
                ready, self._on_ready = self._on_ready, None
                ready()

    def _inventory_bytes(self, state: AgentState) -> bytes:
        inv = msgspec.structs.replace(
            state.inventory,
            boot_id=self._boot_id,
            sent_at=self._clock.now_ms(),
            health=state.health,
            devices=state.devices,
        )
        return inv.to_json()

    async def _send_heartbeat(
        self, state: AgentState, health: NodeHealth, devices: tuple[DeviceHealth, ...]
    ) -> None:
        hb = Heartbeat(
            node_id=self._node_id,
            pool_id=self._pool_id,
            boot_id=self._boot_id,
            seq=self._seq,
            sent_at=self._clock.now_ms(),
            interval_ms=int(self._interval_s * 1000),
            bus_errors=self.stats.bus_errors,
            bookings_etag=self._bookings_etag(),
            inventory_hash=state.inventory.inventory_hash,
            provisioning=state.inventory.provisioning,
            health=health,
            devices=devices,
        )
        plan = self._use.plan(hb)
        if plan.report is not None and not await self._send_use(plan.report):
            plan = self._use.plan_without(hb)
        hb = plan.heartbeat
        body = hb.to_json()
        if len(body) > MAX_HEARTBEAT_BYTES:
            # Only with very many broken devices; the first few still tell the story.
            body = msgspec.structs.replace(hb, devices=devices[:8]).to_json()
        nc = self._nc
        if (
            nc is not None
            and await self._publish(self.hb_subject, body)
            and await self._answered(nc)
        ):
            self._seq += 1
            self._last_health = (health, devices)
            self.stats.heartbeats += 1
            if plan.inline is not None:
                self._use.sent(plan.inline)
            if self._bookings_echoed is not None:
                self._bookings_echoed(hb.bookings_etag)

    def _use_report(self, delta: UseDelta) -> bytes:
        return UseReport(
            node_id=self._node_id,
            pool_id=self._pool_id,
            boot_id=self._boot_id,
            sent_at=self._clock.now_ms(),
            use_version=delta.version,
            devices=delta.devices,
            memory=delta.memory,
        ).to_json()

    async def _send_use(self, delta: UseDelta) -> bool:
        """Publish the whole use; once the server has it, heartbeats go on from it."""
        if not await self._publish(self.use_subject, self._use_report(delta)):
            return False
        self._use.sent(delta)
        self.stats.use_reports += 1
        return True

    async def _publish(self, subject: str, body: bytes) -> bool:
        nc = self._nc
        if nc is None:
            return False
        try:
            await asyncio.wait_for(nc.publish(subject, body), timeout=self._timeout_s)
        except Exception as exc:
            self.stats.failures += 1
            self._count("publish", "publish to %s failed: %s", subject, exc or type(exc).__name__)
            return False
        return True

    def _count(self, kind: str, msg: str, *args: object) -> None:
        self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1
        self._throttle.warning(
            kind, msg + " (NATS errors so far: %d)", *args, self.stats.bus_errors
        )

    # -- callbacks from the client (its dispatcher task) -----------------------------------

    async def _on_request(self, msg: Msg) -> None:
        self.stats.requests += 1
        self._need_inventory = True
        self._wake.set()
        state = self._state
        if msg.reply and state is not None:
            try:
                await asyncio.wait_for(msg.respond(self._inventory_bytes(state)), self._timeout_s)
            except Exception as exc:
                self._count("publish", "inventory reply failed: %s", exc or type(exc).__name__)

    async def _on_use_request(self, msg: Msg) -> None:
        self.stats.use_requests += 1
        full = self._use.full()
        if msg.reply:
            try:
                await asyncio.wait_for(msg.respond(self._use_report(full)), self._timeout_s)
            except Exception as exc:
                self._count("publish", "use reply failed: %s", exc or type(exc).__name__)
        await self._send_use(full)

    async def _on_bookings_msg(self, msg: Msg) -> None:
        if self._on_bookings is not None:
            self._on_bookings(msg.data)

    async def _on_error(self, exc: Exception) -> None:
        kind = error_kind(exc)
        if kind is None:
            log.debug("nats: %s", exc or type(exc).__name__)
            return
        # e.g. "Permissions Violation for Publish to ...": the server names the subject.
        self._count(kind, "NATS refused this agent (%s): %s", kind, exc or type(exc).__name__)

    async def _on_disconnected(self) -> None:
        self._probe.reset()
        if self._closing:
            return
        log.warning("disconnected from nats; keeping only the latest state")

    async def _on_reconnected(self) -> None:
        self.stats.reconnects += 1
        self._rotation.connected(self.server)
        log.info("reconnected to nats at %s", self.server or "?")
        # The coordinator may have missed anything sent while we were away.
        self._need_inventory = True
        self._next_heartbeat = 0.0
        self._wake.set()
