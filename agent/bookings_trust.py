"""Whether a command may trust one of the agent's state files (`vouch`): it must be this
node's, and the agent must have confirmed it lately. `gpufleet-agent env` so trusts the
bookings file (`trust`), `gres-uuids` the GPU map file (agent.gpu_map_file).

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

from pathlib import Path

import msgspec

from agent.errors import CONFIG, NOT_LIVE, AgentError
from shared.wire import BOOKINGS_RESEND_MS, NodeBookings

__all__ = ["ForeignStateFile", "Held", "StaleStateFile", "default_max_age_ms", "trust", "vouch"]


class ForeignStateFile(AgentError, ValueError):
    """A state file names another node: a wrong `state_dir`, `node_id` or copy."""

    status = CONFIG


class StaleStateFile(AgentError, ValueError):
    """The agent has not confirmed a state file for longer than the limit."""

    status = NOT_LIVE


class Held(msgspec.Struct, frozen=True):
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
    """Raise `ForeignStateFile` or `StaleStateFile` when `held` may not be used here now."""
    vouch(
        held.path, "the bookings", held.bookings.node_id, node_id, held.age_ms(now_ms),
        max_age_ms, hint="is the agent running and connected to NATS?",
    )  # fmt: skip


def vouch(
    path: Path, what: str, named: str, node_id: str, age_ms: int, max_age_ms: int, hint: str
) -> None:
    """Raise `ForeignStateFile` when the file at `path`, which holds `what` ("the
    bookings"), names node `named` and this host is another, `StaleStateFile` when the
    agent last confirmed it longer than `max_age_ms` ago; `hint` ends that message."""
    if named != node_id:
        raise ForeignStateFile(
            f"{path} holds {what} of node {named}, and this host is node"
            f" {node_id} (its node_id: --node-id, GPUFLEET_NODE_ID or the agent's config):"
            " refusing them"
        )
    if age_ms > max_age_ms:
        raise StaleStateFile(
            f"{what} in {path} were last confirmed by the agent {span(age_ms)} ago,"
            f" longer than the {span(max_age_ms)} allowed (--max-age): {hint}"
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
