"""Which server the agent reconnects to after a link is lost (`ServerRotation`, its
client's reconnect handler) and how fast it gives up on a silent one (`LinkTiming`)."""

from __future__ import annotations

from urllib.parse import urlsplit

from agent.link_timing import LinkTiming, ServerRotation
from procs.natsproto import Server

POOL = [Server(uri=urlsplit(f"nats://10.0.0.{i}:4222")) for i in (1, 2, 3)]


def picks(rotation: ServerRotation, n: int) -> list[tuple[str, float]]:
    out = []
    for _ in range(n):
        server, delay = rotation(POOL, {})
        out.append((server.uri.hostname, delay))
    return out


def test_the_server_just_left_is_tried_last_and_rounds_wait_between_them() -> None:
    rotation = ServerRotation(wait_s=2.0)
    rotation.connected("10.0.0.1:4222")
    # A hung server still accepts TCP: going back to it first would cost a whole connect
    # timeout while the others are up.
    assert picks(rotation, 4) == [
        ("10.0.0.2", 0.0),
        ("10.0.0.3", 0.0),
        ("10.0.0.1", 0.0),
        ("10.0.0.2", 2.0),  # every server failed once: the next round waits
    ]


def test_a_new_link_starts_a_new_round() -> None:
    rotation = ServerRotation(wait_s=2.0)
    rotation.connected("10.0.0.1:4222")
    assert picks(rotation, 1) == [("10.0.0.2", 0.0)]
    rotation.connected("10.0.0.2:4222")
    assert picks(rotation, 2) == [("10.0.0.1", 0.0), ("10.0.0.3", 0.0)]


def test_a_lone_server_is_retried_after_the_wait() -> None:
    rotation = ServerRotation(wait_s=2.0)
    rotation.connected("10.0.0.1:4222")
    lone = POOL[:1]
    assert [rotation(lone, {})[1] for _ in range(3)] == [0.0, 2.0, 2.0]


def test_a_dead_link_is_noticed_within_a_third_of_the_window_with_room_to_reconnect() -> None:
    for interval_s, misses in [(5.0, 3), (2.0, 3), (30.0, 3), (5.0, 5)]:
        timing = LinkTiming.for_window(interval_s, misses)
        third = misses * interval_s / 3
        assert timing.probe_every_s + timing.probe_timeout_s <= 0.6 * third + 1e-9
    # The defaults (5 s, 3 misses: a 15 s window) probe like the coordinator does.
    assert LinkTiming.for_window(5.0, 3) == LinkTiming(probe_every_s=1.0, probe_timeout_s=2.0)
    # Very short intervals keep floors: a loaded host's slowness is no dead server.
    assert LinkTiming.for_window(0.2, 3) == LinkTiming(probe_every_s=0.25, probe_timeout_s=0.5)
