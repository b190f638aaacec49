"""Whether `gpufleet-agent env` may trust the bookings state file: it must be this
node's, and the agent must have confirmed it lately.

The file holds the `NodeBookings` message as received; its modification time is when
the agent last knew it current: the agent writes it on receipt and touches it after each
heartbeat that echoed its etag reached the NATS server (the coordinator re-sends a
node's bookings whenever the echoed etag is not its own). An agent that is stopped, or
cut off from NATS, stops touching it, so a booking released meanwhile is not trusted
for long. `sentAt` (the coordinator's clock) says when the content was sent; it stays
old while nothing changes, so it is shown, not judged.

The default limit is `misses × interval_s` (the coordinator's detection window: by then
it calls the node unreachable) plus one re-send period, 20 s with the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.errors import CONFIG, NOT_LIVE, AgentError
from shared.wire import BOOKINGS_RESEND_MS, NodeBookings

__all__ = ["ForeignBookings", "Held", "StaleBookings", "default_max_age_ms", "trust"]


class ForeignBookings(AgentError, ValueError):
    """The state file names another node: a wrong `state_dir`, `node_id` or copy."""

    status = CONFIG


class StaleBookings(AgentError, ValueError):
    """The agent has not confirmed the state file for longer than the limit."""

    status = NOT_LIVE


@dataclass(frozen=True, slots=True)
class Held:
    """The state file's content, and when the agent last confirmed it (ms, this host)."""

    path: Path
    bookings: NodeBookings
    checked_at: int

    def age_ms(self, now_ms: int) -> int:
        # A clock stepped back since the touch reads as fresh, not as a negative age.
        return max(0, now_ms - self.checked_at)


def default_max_age_ms(interval_s: float, misses: int) -> int:
    return round(misses * interval_s * 1000) + BOOKINGS_RESEND_MS


def trust(held: Held, node_id: str, now_ms: int, max_age_ms: int) -> None:
    """Raise `ForeignBookings` or `StaleBookings` when `held` may not be used here now."""
    named = held.bookings.node_id
    if named != node_id:
        raise ForeignBookings(
            f"{held.path} holds the bookings of node {named}, and this host is node"
            f" {node_id} (its node_id: --node-id, GPUFLEET_NODE_ID or the agent's config):"
            " refusing them"
        )
    age = held.age_ms(now_ms)
    if age > max_age_ms:
        raise StaleBookings(
            f"the bookings in {held.path} were last confirmed by the agent {span(age)} ago,"
            f" longer than the {span(max_age_ms)} allowed (--max-age): is the agent"
            " running and connected to NATS?"
        )


def span(ms: int) -> str:
    """An age as people read it: `4.2 s`, `12 min 5 s`, `3 h 2 min`, `2 d 4 h`."""
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    whole = int(s)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60)):
        if whole >= size:
            return f"{whole // size} {unit} {whole % size // sub_size} {sub}"
    return f"{whole // 60} min {whole % 60} s"
