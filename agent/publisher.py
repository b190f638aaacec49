"""The agent's NATS side (the only module that imports nats): inventory and heartbeats.

The poller hands over its latest `AgentState` with `update()`, which never blocks; this
module's own task publishes it. Inventory goes out at start, whenever its hash changes,
after every reconnect and when the coordinator asks on the inventory-request subject
(answered on the reply subject too when the request has one). Heartbeats go out every
interval on their own timer, and at once when health changes.

While NATS is away nothing is queued: only the latest state is kept, and the next
connection gets that. Every network wait has a timeout. If polling stalls (NVML can
hang when a GPU falls off the bus), heartbeats keep flowing but report the node
`unmonitored` instead of repeating a stale "healthy".

`nats_credentials` is either a NATS JWT `.creds` file (decentralised auth) or the
user/password file that `gpufleet nats-auth` writes (`user = "…"`, `password = "…"`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client

from agent.state import AgentState
from shared.clock import Clock
from shared.credentials import CredentialsError, connect_options
from shared.settings import ConfigError
from shared.subjects import Subjects
from shared.wire import MAX_HEARTBEAT_BYTES, DeviceHealth, Heartbeat, NodeHealth

log = logging.getLogger(__name__)


def auth_options(creds: Path | None) -> dict[str, Any]:
    """nats-py connect options for a credentials file, read once at start (a new file
    takes a restart, which is what the Ansible handler does)."""
    if creds is None:
        return {}
    try:
        text = creds.read_text()
    except OSError as exc:
        raise ConfigError(
            "nats_credentials", f"cannot read {creds}: {exc.strerror or exc}"
        ) from None
    try:
        return connect_options(text, str(creds), str(creds))
    except CredentialsError:
        raise ConfigError(
            "nats_credentials", f"{creds} is neither a NATS .creds file nor user/password TOML"
        ) from None


@dataclass
class PublisherStats:
    heartbeats: int = 0
    inventories: int = 0
    requests: int = 0
    failures: int = 0
    skipped_offline: int = 0
    reconnects: int = 0


class Publisher:
    def __init__(
        self,
        *,
        servers: str,
        subjects: Subjects,
        pool_id: str,
        node_id: str,
        boot_id: str,
        interval_s: float,
        clock: Clock,
        creds: Path | None = None,
        timeout_s: float = 5.0,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self._servers = [s.strip() for s in servers.split(",") if s.strip()]
        self._subjects = subjects
        self._pool_id = pool_id
        self._node_id = node_id
        self._boot_id = boot_id
        self._interval_s = interval_s
        self._clock = clock
        self._auth = auth_options(creds)
        # Called once, after the first inventory is out: systemd's READY=1.
        self._on_ready = on_ready
        self._timeout_s = timeout_s
        self._nc: Client | None = None
        self._closing = False
        self._state: AgentState | None = None
        self._wake = asyncio.Event()
        self._need_inventory = True
        self._sent_hash: str | None = None
        self._last_health: tuple[NodeHealth, tuple[DeviceHealth, ...]] | None = None
        self._next_heartbeat = 0.0
        self._seq = 0
        self.stats = PublisherStats()
        self.inv_subject = subjects.inventory(pool_id, node_id)
        self.hb_subject = subjects.heartbeat(pool_id, node_id)
        self.req_subject = subjects.inventory_request(pool_id, node_id)

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    @property
    def latest(self) -> AgentState | None:
        """The one state waiting to be published: there is never a backlog."""
        return self._state

    def update(self, state: AgentState) -> None:
        """Latest state wins; never blocks, whatever NATS is doing."""
        self._state = state
        self._wake.set()

    async def run(self) -> None:
        """Connect (retrying forever, nats-py reconnects after that) and publish until
        cancelled."""
        nc = Client()
        self._nc = nc
        try:
            await nc.connect(
                servers=self._servers,
                name=f"gpufleet-agent {self._node_id}",
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=2,
                connect_timeout=int(max(1, self._timeout_s)),
                ping_interval=10,
                max_outstanding_pings=3,
                **self._auth,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
            log.info("connected to %s", nc.connected_url.netloc if nc.connected_url else "?")
            await nc.subscribe(self.req_subject, cb=self._on_request)
            while True:
                delay = max(0.0, self._next_heartbeat - self._clock.monotonic())
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=delay)
                except TimeoutError:
                    pass
                self._wake.clear()
                await self._flush()
        finally:
            await self._close(nc)

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
            inventory_hash=state.inventory.inventory_hash,
            provisioning=state.inventory.provisioning,
            health=health,
            devices=devices,
        )
        body = hb.to_json()
        if len(body) > MAX_HEARTBEAT_BYTES:
            # Only with very many broken devices; the first few still tell the story.
            body = msgspec.structs.replace(hb, devices=devices[:8]).to_json()
        if await self._publish(self.hb_subject, body):
            self._seq += 1
            self._last_health = (health, devices)
            self.stats.heartbeats += 1

    async def _publish(self, subject: str, body: bytes) -> bool:
        nc = self._nc
        if nc is None:
            return False
        try:
            await asyncio.wait_for(nc.publish(subject, body), timeout=self._timeout_s)
        except Exception as exc:
            self.stats.failures += 1
            log.warning("publish to %s failed: %s", subject, exc or type(exc).__name__)
            return False
        return True

    # -- callbacks from nats-py -------------------------------------------------------------

    async def _on_request(self, msg: Any) -> None:
        self.stats.requests += 1
        self._need_inventory = True
        self._wake.set()
        state = self._state
        if msg.reply and state is not None:
            try:
                await asyncio.wait_for(msg.respond(self._inventory_bytes(state)), self._timeout_s)
            except Exception as exc:
                log.warning("inventory reply failed: %s", exc)

    async def _on_error(self, exc: Exception) -> None:
        log.debug("nats: %s", exc or type(exc).__name__)

    async def _on_disconnected(self) -> None:
        if self._closing:
            return
        log.warning("disconnected from nats; keeping only the latest state")

    async def _on_reconnected(self) -> None:
        self.stats.reconnects += 1
        log.info("reconnected to nats")
        # The coordinator may have missed anything sent while we were away.
        self._need_inventory = True
        self._next_heartbeat = 0.0
        self._wake.set()
