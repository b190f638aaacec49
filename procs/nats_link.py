"""The NATS link probe every gpufleet process that must notice a hung server runs: the
coordinator's bus, the alert forwarder, the Slurm bridge (moved here from the
coordinator's bus, issue 34, so that they judge a link the same way) and the agent,
which also asks after each heartbeat whether the server has it (`answered`: a PING of
its own, judged the same way when it goes unanswered).

A half-open link (TCP stalls without closing, a server stopped with SIGSTOP) closes
nothing, so nobody tells the client: `LinkProbe.probe` round-trips a PING, and when no
PONG comes within `timeout_s`, and nothing else came meanwhile, the link is taken as
dead: counted (`failures`), logged, the `on_dead` hook called and nats-py told to
reconnect. Run every `interval_s` (`LinkProbe.run`), a dead link is noticed in about
interval + timeout (3 s by default); nats-py's own pings (`PING_INTERVAL_S`,
`MAX_OUTSTANDING_PINGS`) are a slow backstop.

A busy link is not a dead one: the probe's PONG queues behind every message the server
holds for us, so on a starved or overloaded machine it may come late while messages
keep arriving. A probe that times out while bytes arrived meanwhile (`stats["in_bytes"]`)
is counted as late (`late`, logged at warning) and reconnects nothing: dropping the link
would drop everything the server holds for us, uncounted (issue 32). Only a link that
delivers nothing is taken as dead.

A caller that sees the link dead by other means (a JetStream consumer that holds
messages and hands none over) calls `take_dead` with its reason.

The probe speaks to a `NatsLink`: the few members it uses, which nats-py's `Client` (the
coordinator, the forwarder, the bridge) and the agent's own `procs.natsproto.Client`
both have. This module imports neither.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from procs.log_throttle import LogThrottle
from procs.nats import ServerUrl, host_port

Hook = Callable[[], None]

# nats-py's own stale-link detection, the backstop to the probe: a PING every 2 s, the
# link dead after 30 unanswered (about a minute). It cannot tell a dead link from a busy
# one and drops the link silently, with all the server holds (issue 32).
PING_INTERVAL_S = 2
MAX_OUTSTANDING_PINGS = 30
# How long a probe's PING may wait for its PONG in nats-py: only a bound on the task;
# the probe itself judges the link every `timeout_s`.
PROBE_PATIENCE_S = 600


class NatsLink(Protocol):
    """A NATS client as the probe sees it: connected or not, on which server, how many
    bytes it has received and how many times it reconnected (`stats`), a PING round
    trip (`flush`) and a move to another server (`force_reconnect`)."""

    @property
    def is_connected(self) -> bool: ...

    @property
    def connected_url(self) -> ServerUrl | None: ...

    @property
    def stats(self) -> Mapping[str, int]: ...

    async def flush(self, timeout: int) -> None: ...  # noqa: ASYNC109 - nats-py's

    async def force_reconnect(self) -> None: ...


def server_of(nc: NatsLink) -> str:
    """host:port of the server `nc` is on ("?" when none); never the URL's credentials."""
    return host_port(nc.connected_url) or "?"


def _link_of(nc: NatsLink) -> int:
    """Which link of `nc` this is: nats-py counts its reconnects."""
    return int(nc.stats["reconnects"])


def _retrieve(task: asyncio.Future[None]) -> None:
    """A probe's flush that ended unwatched (its link gone): its error is known."""
    if not task.cancelled():
        task.exception()


class LinkProbe:
    def __init__(
        self,
        log: logging.Logger,
        *,
        timeout_s: float = 2.0,
        on_dead: Hook | None = None,
        backlog: Callable[[], int] = lambda: 0,
    ) -> None:
        self.timeout_s = timeout_s
        self._log = log
        self._on_dead = on_dead
        self._backlog = backlog
        self.failures = 0  # links taken as dead, by the probe or `take_dead`
        self.late = 0  # probes answered late on a link that kept delivering
        self._probing: asyncio.Future[None] | None = None  # the newest PING out
        self._bytes = 0  # bytes received when the probe last looked
        self._link = 0  # `_link_of` when `_probing` was sent
        self._throttle = LogThrottle(log)

    def reset(self) -> None:
        """The link went down: a PONG still awaited would be the old link's."""
        self._probing = None

    async def probe(self, nc: NatsLink | None) -> bool:
        """Round-trip a PING on `nc`; True when the link was taken as dead (and the
        client told to reconnect). A PONG still on its way is waited for by the next probe
        (one PING out at a time)."""
        if nc is None or not nc.is_connected:
            return False
        if self._probing is None or self._probing.done():
            self._bytes = nc.stats["in_bytes"]
            self._probing = self._ping(nc)
        # What had arrived when this wait began, kept here: an `answered` meanwhile
        # moves `_bytes` to its own start, and a window cut short that way may see no
        # bytes on a busy link whose reads come in bursts (the agent's client).
        ping, link, received = self._probing, self._link, self._bytes
        done, _ = await asyncio.wait({ping}, timeout=self.timeout_s)
        if done:
            if ping.exception() is not None and self._probing is ping:
                # A flush that failed: the connection closed or reconnected meanwhile.
                self._probing = None
            return False
        self._bytes = nc.stats["in_bytes"]
        return await self._unanswered(nc, self._bytes != received, link)

    async def answered(self, nc: NatsLink) -> bool:
        """Whether the server answers a PING sent now within `timeout_s`: everything
        written before it has reached the server (the agent counts a heartbeat as sent
        only then). No answer is judged as `probe` judges one: late while messages
        keep arriving, else the link is taken as dead."""
        if not nc.is_connected:
            return False
        received, link = nc.stats["in_bytes"], _link_of(nc)
        ping = self._ping(nc)
        # The newest PING: its PONG comes after every earlier one's (nats-py matches
        # them in order), so the periodic probe may wait on it too.
        self._probing, self._bytes = ping, received
        done, _ = await asyncio.wait({ping}, timeout=self.timeout_s)
        if done:
            return ping.exception() is None
        await self._unanswered(nc, nc.stats["in_bytes"] != received, link)
        return False

    def _ping(self, nc: NatsLink) -> asyncio.Future[None]:
        """A PING on `nc`, its PONG awaited without a timeout that nats-py would act on.
        nats-py cancels a PONG's future when flush's timeout passes, and a PONG that
        comes after that breaks its read loop (nats-py 2.16 `_process_pong` sets the
        cancelled future's result): the link then reads nothing more, silently, until
        nats-py's own pings give up on it. So its timeout is a long one, and ours only
        stops waiting."""
        self._link = _link_of(nc)
        ping = asyncio.ensure_future(nc.flush(timeout=PROBE_PATIENCE_S))
        ping.add_done_callback(_retrieve)
        return ping

    async def _unanswered(self, nc: NatsLink, arrived: bool, link: int) -> bool:
        """A PING on link `link` (`_link_of`) not answered in time: late when bytes
        `arrived` meanwhile, else the link taken as dead; True when it was."""
        if not nc.is_connected or _link_of(nc) != link:
            # nats-py noticed first and is on it, or another probe (a periodic one and
            # one after a write both wait on a hung server) has left that link already:
            # leaving the new one would cost a reconnect for nothing.
            return False
        if arrived:
            # Alive, and we are behind reading it: the PONG waits behind messages.
            self.late += 1
            self._throttle.warning(
                "probe_late",
                "NATS answered no probe within %.1fs while messages kept arriving:"
                " behind on reading, not cut off (%d waiting)",
                self.timeout_s,
                self._backlog(),
            )
            return False
        await self.take_dead(nc, f"no answer from NATS within {self.timeout_s:.1f}s")
        return True

    async def take_dead(self, nc: NatsLink, reason: str) -> None:
        """Count the link as dead, say why and where, and have the client reconnect."""
        self._probing = None  # its PONG will never come: the next link has its own
        self.failures += 1
        where = server_of(nc)
        self._log.warning("%s (server %s): link taken as dead; reconnecting", reason, where)
        if self._on_dead:
            self._on_dead()
        if nc.is_connected:
            await nc.force_reconnect()

    async def run(self, nc: Callable[[], NatsLink | None], interval_s: float) -> None:
        """Probe the client `nc()` gives every `interval_s` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            await self.probe(nc())
