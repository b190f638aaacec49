"""The agent's NATS link, timed: how often it is probed and how long an answer may take
(`LinkTiming`, from the coordinator's detection window), and which server a reconnect
goes to (`ServerRotation`). Pure: `agent.publisher`, the agent's only NATS user, uses
them."""

from __future__ import annotations

from typing import Any

import msgspec

from procs.nats import host_port

# Floors of the link probe, for very short intervals: a loaded host must not take its
# own slowness for a dead server and hop between servers.
MIN_PROBE_EVERY_S = 0.25
MIN_PROBE_TIMEOUT_S = 0.5
# Seconds between rounds of reconnect attempts once every server has failed once.
RECONNECT_WAIT_S = 2.0


class LinkTiming(msgspec.Struct, frozen=True):
    """How often the link is probed and how long an answer may take. The coordinator
    marks a node unreachable after misses × interval of silence; a dead link is noticed
    within probe_every_s + probe_timeout_s = 3/5 of a third of that window, and the rest
    of the third is left for the reconnect and the heartbeat it sends at once."""

    probe_every_s: float
    probe_timeout_s: float

    @classmethod
    def for_window(cls, interval_s: float, misses: int) -> LinkTiming:
        budget = misses * interval_s / 3
        return cls(
            probe_every_s=max(MIN_PROBE_EVERY_S, budget / 5),
            probe_timeout_s=max(MIN_PROBE_TIMEOUT_S, 2 * budget / 5),
        )


class ServerRotation:
    """The client's `reconnect_to_server_handler` (`procs.natsproto.servers.Chooser`, the
    hook nats-py has by that name): which server the next reconnect attempt
    goes to, and after how long. Servers not yet tried since the link was lost come
    first, in the pool's (shuffled) order, and the server just left comes last: a hung
    one still accepts TCP connections and would cost a whole connect timeout. Once every
    server has been tried, a new round starts after `wait_s`."""

    def __init__(self, wait_s: float = RECONNECT_WAIT_S) -> None:
        self.wait_s = wait_s
        self.left = ""  # host:port of the server whose link was lost
        self._tried: set[str] = set()

    def connected(self, server: str) -> None:
        """A link is up to `server`: if it is lost, that is the one left."""
        self.left = server
        self._tried.clear()

    def __call__(self, servers: list[Any], server_info: dict[str, Any]) -> tuple[Any, float]:
        names = [host_port(s.uri) for s in servers]  # as the publisher names its server
        delay = 0.0
        if all(name in self._tried for name in names):
            self._tried.clear()
            delay = self.wait_s
        untried = [i for i, name in enumerate(names) if name not in self._tried]
        pick = next((i for i in untried if names[i] != self.left), untried[0])
        self._tried.add(names[pick])
        return servers[pick], delay
