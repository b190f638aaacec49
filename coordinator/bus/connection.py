"""One NATS connection for the coordinator, with connect/disconnect hooks.

The first connect is retried with backoff (the coordinator may start before NATS);
after that nats-py reconnects forever and tells us, so liveness can stop judging nodes
while we are the ones cut off.

A half-open link (TCP stalls without closing) closes nothing, so nobody tells us:
`probe` (a named loop) runs the link probe every process shares
(`procs.nats_link.LinkProbe`): no PONG within `probe_timeout_s`, and nothing else
arriving meanwhile, calls the same down hook and has nats-py reconnect, so a dead link
is noticed in about interval + timeout (3 s by default), well within a node's detection
window. A late PONG while messages keep arriving is a busy link, not a dead one
(`probe_late`, issue 32).

Client errors are counted by kind in `errors` (slow consumer: messages the server
had for us that we dropped; authorization and permissions violations) and logged at
warning, at most once per kind per period. A slow consumer also calls `on_behind` with
the dropped message's subject: heartbeats were lost on our side, so liveness treats it
as our own outage, and ingest counts the message as dropped (`slow_consumer`).

`backlog()` is how many messages wait unread in our subscriptions (ingest falling
behind), and `auth_required` what the server said in its INFO (read at each connect):
whether it lets anyone connect without credentials.

Its `NatsSettings` say where and as whom (`procs.nats_connect`): the credentials file
is a NATS JWT `.creds` file or the user/password file that `gpufleet nats-auth` writes
(see `ops.kit.nats_server_config`), TLS is for `tls://` servers (or servers that
require TLS), and the URL may list several seeds (comma-separated): each connect
attempt tries them all, so the coordinator starts when any one is up, and then follows
the servers the cluster announces.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from procs.log_throttle import LogThrottle
from procs.nats import NatsSettings, host_port
from procs.nats_connect import RECONNECT_FOREVER, Retry, connect
from procs.nats_link import MAX_OUTSTANDING_PINGS, PING_INTERVAL_S, LinkProbe

log = logging.getLogger(__name__)

Hook = Callable[[], None]
# Called with the subject of each message the client dropped as a slow consumer.
BehindHook = Callable[[str], None]
MessageHandler = Callable[[Msg], Awaitable[None]]
BatchHandler = Callable[[Msg], None]

# Messages handled per turn of the event loop by `subscribe_batched`.
BATCH = 64

# A first connect is retried only while no server answers: refused credentials are final.
FIRST_CONNECT_ERRORS = (OSError, TimeoutError, nats.errors.NoServersError)
# How long closing waits for a server's answer, per step (see `Bus.close`).
CLOSE_TIMEOUT_S = 1.0


def error_kind(exc: Exception) -> str:
    """The metric label of a NATS client error."""
    if isinstance(exc, nats.errors.SlowConsumerError):
        return "slow_consumer"
    if isinstance(exc, nats.errors.AuthorizationError):
        return "authorization"
    if "permissions violation" in str(exc).lower():
        return "permissions"
    return "other"


class Bus:
    def __init__(
        self,
        settings: NatsSettings,
        *,
        name: str = "gpufleet-coordinator",
        on_up: Hook | None = None,
        on_down: Hook | None = None,
        on_behind: BehindHook | None = None,
        probe_timeout_s: float = 2.0,
        pending_msgs_limit: int = 200_000,
    ) -> None:
        self.settings = settings
        self.servers = settings.servers  # ValueError now for a URL that is none
        self.name = name
        self._on_up = on_up
        self._on_down = on_down
        self._on_behind = on_behind
        self._subscriptions: list[Any] = []
        self._probe_timeout_s = probe_timeout_s
        self._pending_msgs_limit = pending_msgs_limit
        self.nc: Client | None = None
        self.errors: dict[str, int] = {}
        # What the connected server says of itself in its INFO (`_read_server_info`).
        self.server_info: dict[str, Any] = {}
        self._probe = LinkProbe(
            log, timeout_s=probe_timeout_s, on_dead=self._dead, backlog=self.backlog
        )
        self._throttle = LogThrottle(log)

    @property
    def probe_failures(self) -> int:
        return self._probe.failures

    @property
    def probe_late(self) -> int:
        """Probes answered late on a link that kept delivering."""
        return self._probe.late

    def _dead(self) -> None:
        if self._on_down:
            self._on_down()

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    @property
    def connected_server(self) -> str:
        """host:port of the server this connection is on now ("" when none), never the
        URL's credentials: it is logged and shown."""
        return host_port(self.nc.connected_url) if self.nc is not None else ""

    def cluster_size(self) -> int:
        """How many servers the connected one says its cluster has (itself included): 1
        outside a cluster. Read from its INFO, so only as fresh as the last (re)connect."""
        info = self.server_info
        if not info.get("cluster"):
            return 1
        urls = set(info.get("connect_urls") or [])
        return max(1, len(urls | {f"{info.get('host')}:{info.get('port')}"}))

    @property
    def auth_required(self) -> bool:
        """Whether the server we are connected to demands credentials (its INFO)."""
        return bool(self.server_info.get("auth_required", False))

    @property
    def tls(self) -> bool:
        tls_url = self.settings.url.startswith("tls://")
        return bool(self.server_info.get("tls_required", False)) or tls_url

    async def _read_server_info(self) -> None:
        """Keep the INFO of the server we are connected to in `server_info`. nats-py keeps
        the one it got only in a private attribute, so this reads it as the protocol
        gives it: a server sends INFO to every new connection first, in clear (TLS, when
        required, starts after it), on a connection of its own closed at once."""
        nc = self.nc
        url = nc.connected_url if nc is not None else None
        if url is None or url.hostname is None:
            return
        timeout = self._probe_timeout_s
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(url.hostname, url.port or 4222), timeout
        )
        try:
            line = await asyncio.wait_for(reader.readline(), timeout)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await asyncio.wait_for(writer.wait_closed(), timeout)
        if not line.startswith(b"INFO "):
            raise nats.errors.Error(f"no INFO from NATS at {host_port(url)}: {line[:40]!r}")
        info = json.loads(line[5:])
        self.server_info = info if isinstance(info, dict) else {}

    def backlog(self) -> int:
        """Messages delivered to us and not yet handled, over every subscription."""
        return sum(int(sub.pending_msgs) for sub in self._subscriptions)

    async def connect(self, *, attempts: int = 0, connect_timeout_s: float = 5.0) -> None:
        """Connect, retrying with backoff; `attempts=0` retries until cancelled."""
        options = dict(
            # Seeds in the order given: the operator lists the nearest first.
            dont_randomize=True,
            name=self.name,
            connect_timeout=connect_timeout_s,
            reconnect_time_wait=0.5,
            **RECONNECT_FOREVER,
            ping_interval=PING_INTERVAL_S,
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            disconnected_cb=self._disconnected,
            reconnected_cb=self._reconnected,
            error_cb=self._error,
        )
        retry = Retry(first_s=0.2, max_s=5.0, attempts=attempts, errors=FIRST_CONNECT_ERRORS)
        self.nc = await connect(self.settings, options, retry=retry, log=log)
        await self._read_server_info()
        log.info("connected to NATS at %s", self.connected_server)
        if self._on_up:
            self._on_up()

    async def _disconnected(self) -> None:
        self._probe.reset()
        log.warning("disconnected from NATS")
        if self._on_down:
            self._on_down()

    async def _reconnected(self) -> None:
        log.info("reconnected to NATS at %s", self.connected_server)
        try:
            await self._read_server_info()
        except (OSError, TimeoutError, ValueError, nats.errors.Error) as exc:
            log.warning("could not read the INFO of NATS at %s: %s", self.connected_server, exc)
        if self._on_up:
            self._on_up()

    async def _error(self, exc: Exception) -> None:
        if isinstance(exc, nats.errors.SlowConsumerError):
            self._count("slow_consumer", f"dropped a message on {exc.subject}")
            if self._on_behind:
                self._on_behind(exc.subject)
            return
        self._count(error_kind(exc), str(exc) or type(exc).__name__)

    def _count(self, kind: str, detail: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self._throttle.warning(kind, "NATS client error (%s): %s", kind, detail)

    async def probe(self) -> None:
        """Round-trip a PING (`LinkProbe.probe`); a link taken as dead calls the down
        hook and reconnects."""
        await self._probe.probe(self.nc)

    def _client(self) -> Client:
        if self.nc is None:
            raise RuntimeError("bus not connected")
        return self.nc

    async def subscribe(self, subject: str, handler: MessageHandler, queue: str = "") -> None:
        sub = await self._client().subscribe(
            subject, queue=queue, cb=handler, pending_msgs_limit=self._pending_msgs_limit
        )
        self._subscriptions.append(sub)

    async def subscribe_batched(
        self, subject: str, handle: BatchHandler, queue: str = "", batch: int = BATCH
    ) -> None:
        """Like `subscribe`, for a hot subject: `handle` (synchronous, never raising) is
        given each message, and the event loop runs after every `batch` of them. nats-py
        hands a waiting message to its callback without a turn of the loop, so a burst
        would otherwise hold the API, the sweep and the socket reader until it is done."""
        count = 0

        async def on_message(msg: Msg) -> None:
            nonlocal count
            handle(msg)
            count += 1
            if count >= batch:
                count = 0
                await asyncio.sleep(0)

        await self.subscribe(subject, on_message, queue)

    async def publish(self, subject: str, payload: bytes) -> None:
        await self._client().publish(subject, payload)

    def jetstream(self, timeout_s: float) -> JetStreamContext:
        return self._client().jetstream(timeout=timeout_s)

    async def flush(self, timeout_s: int = 5) -> None:
        await self._client().flush(timeout=timeout_s)

    async def close(self) -> None:
        """Flush what we published, then close; each bounded by `CLOSE_TIMEOUT_S`, so
        a server that stopped answering costs shutdown about two of them. Not nats-py's
        `drain`: it swallows the cancel of its own timeout and then waits on the hung
        server again (5 s and more), and what it would still deliver to us is of no
        use, the loops that act on it having stopped first."""
        nc = self.nc
        if nc is None or nc.is_closed:
            return
        if nc.is_connected:
            try:
                # nats-py annotates the timeout as int; it is used as a float.
                await nc.flush(timeout=CLOSE_TIMEOUT_S)  # type: ignore[arg-type]
            except (TimeoutError, nats.errors.Error) as exc:
                log.warning("NATS did not confirm our last messages: %s", exc or type(exc).__name__)
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await nc.close()
        except TimeoutError:
            log.warning("NATS connection not closed within %.1f s; left behind", CLOSE_TIMEOUT_S)
