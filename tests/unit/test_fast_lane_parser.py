"""The fast lane's parser (coordinator/bus/fast_lane.py) takes the heartbeat frames at the
head of each read and leaves everything else to nats-py's parser: whatever way the
server's byte stream is cut into reads, every frame reaches the subscription it is for,
once, in order, with its exact payload.

A real nats-py client, not connected: the bytes are fed to its parser as its read loop
would (`tests/integration/test_bus_errors.py` drives the lane through a real server)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from coordinator.bus.fast_lane import FastLane

LANE, OTHER = 1, 2


def msg(sid: int, subject: bytes, payload: bytes, reply: bytes = b"") -> bytes:
    head = b"MSG %s %d %s%d\r\n" % (subject, sid, reply + b" " if reply else b"", len(payload))
    return head + payload + b"\r\n"


def hmsg(sid: int, subject: bytes, payload: bytes) -> bytes:
    headers = b"NATS/1.0\r\nX-Kind: test\r\n\r\n"
    size = len(headers) + len(payload)
    return (
        b"HMSG %s %d %d %d\r\n" % (subject, sid, len(headers), size) + headers + payload + b"\r\n"
    )


# A stream as nats-server writes it: heartbeats for the lane, with payloads that look
# like protocol, empty and large ones, among frames the lane must leave alone.
PAYLOADS = [
    b'{"nodeId":"gpu-1","seq":1}',
    b"",
    b"MSG fake 1 3\r\nabc\r\n",
    b"x" * 40_000,
    b"\r\n",
]
FRAMES: list[tuple[str, bytes, bytes]] = []  # (who should get it, subject, payload)
for i, payload in enumerate(PAYLOADS):
    FRAMES.append(("lane", b"t.hb.p.gpu-%d" % i, payload))
FRAMES.insert(2, ("lane-reply", b"t.hb.p.asks", b"with a reply"))
FRAMES.insert(3, ("other", b"t.inv.p.gpu-1", b'{"inventory":1}'))
FRAMES.insert(4, ("ok", b"", b""))
FRAMES.insert(5, ("other-headers", b"t.inv.p.gpu-2", b"headers and all"))
FRAMES.append(("unknown", b"t.gone", b"a subscription that is gone"))
FRAMES.append(("lane", b"t.hb.p.last", b"last"))


def wire(frames: list[tuple[str, bytes, bytes]]) -> bytes:
    out = b""
    for who, subject, payload in frames:
        if who == "lane":
            out += msg(LANE, subject, payload)
        elif who == "lane-reply":
            out += msg(LANE, subject, payload, reply=b"_INBOX.1")
        elif who == "other":
            out += msg(OTHER, subject, payload)
        elif who == "other-headers":
            out += hmsg(OTHER, subject, payload)
        elif who == "ok":
            out += b"+OK\r\n"
        else:
            out += msg(99, subject, payload)
    return out


STREAM = wire(FRAMES)
# Cuts worth trying: around every frame's start, its control line's end and its
# payload's end (a read that ends between a payload and its CRLF, say).
NEAR_EDGES = sorted(
    {
        max(0, min(len(STREAM), edge + d))
        for at in range(len(STREAM))
        if STREAM.startswith((b"MSG ", b"HMSG ", b"+OK"), at) or STREAM.startswith(b"\r\n", at)
        for edge in (at, at + 2)
        for d in range(-2, 3)
    }
)


@asynccontextmanager
async def lane_on_a_client() -> AsyncIterator[tuple[Client, FastLane, list[tuple[str, bytes]]]]:
    client = Client()
    full: list[str] = []
    lane = FastLane.install(client, max_msgs=1_000, max_bytes=10**7, on_full=full.append)
    assert lane is not None
    handled: list[tuple[str, bytes]] = []
    for sid, subject in ((LANE, "t.hb.>"), (OTHER, "t.inv.>")):
        client._subs[sid] = Subscription(client, id=sid, subject=subject)
    lane.add(LANE, lambda subject, data: handled.append((subject, data)))
    try:
        yield client, lane, handled
    finally:
        await lane.close()
        assert full == []


def queued(client: Client, sid: int) -> list[tuple[str, bytes]]:
    queue = client._subs[sid]._pending_queue
    out = []
    while not queue.empty():
        m = queue.get_nowait()
        out.append((m.subject, m.data))
    return out


def expected(who: set[str]) -> list[tuple[str, bytes]]:
    return [(s.decode(), p) for w, s, p in FRAMES if w in who]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.one_of(st.sampled_from(NEAR_EDGES), st.integers(0, len(STREAM))), max_size=12)
)
async def test_every_frame_reaches_its_subscription_once_however_the_reads_are_cut(
    cuts: list[int],
) -> None:
    async with lane_on_a_client() as (client, lane, handled):
        bounds = [0, *sorted(cuts), len(STREAM)]
        for start, end in itertools.pairwise(bounds):
            await client._ps.parse(STREAM[start:end])
        await lane.close()  # handles what still waits in the lane
        assert handled == expected({"lane"})
        assert queued(client, LANE) == expected({"lane-reply"})
        assert queued(client, OTHER) == expected({"other", "other-headers"})
        assert not client._ps.buf
        assert client.stats["in_msgs"] >= len(expected({"lane", "lane-reply", "other"}))


async def test_a_read_of_whole_heartbeat_frames_is_taken_in_one_pass() -> None:
    frames = [("lane", b"t.hb.p.gpu-%d" % i, b'{"seq":%d}' % i) for i in range(100)]
    async with lane_on_a_client() as (client, lane, handled):
        await client._ps.parse(wire(frames))
        # Queued by the lane's own pass, before the drain task has run once.
        assert lane.backlog == 100 and not client._ps.buf
        await lane.close()
        assert handled == [(s.decode(), p) for _, s, p in frames]


async def test_heartbeat_frames_cut_by_a_read_never_fall_back_to_nats_pys_parser() -> None:
    """A read ends mid-frame nearly every time; the cut frame waits for the next read in
    the lane's own pass (nats-py's parser, had it taken it, would parse the whole next
    read one coroutine per message)."""
    frames = [("lane", b"t.hb.p.gpu-%d" % i, b'{"seq":%d}' % i) for i in range(100)]
    stream = wire(frames)
    payloads = [i for i in range(len(stream)) if stream.startswith(b'{"seq"', i)]
    # In a control line, in a payload, between a payload and its CRLF.
    cuts = (5, payloads[10] - 3, payloads[30] + 3, payloads[60] + 9, payloads[99] + 10)
    async with lane_on_a_client() as (client, lane, handled):
        for cut in cuts:
            await client._ps.parse(stream[:cut])
            await client._ps.parse(stream[cut:])
            assert not client._ps.msg_arg, f"nats-py parsed a frame (cut at {cut})"
        await lane.close()
        assert handled == [(s.decode(), p) for _, s, p in frames] * 5
