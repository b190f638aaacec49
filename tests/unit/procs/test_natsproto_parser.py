"""The agent's NATS client reads the server's operations however the socket splits
them: every split of a stream of every kind of operation gives the same operations,
and what is not the protocol is refused."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procs.natsproto.errors import ProtocolError
from procs.natsproto.parser import Err, Info, Msg, Ok, Op, Parser, Ping, Pong

STREAM = (
    b'INFO {"server_id":"S1","max_payload":1048576,"connect_urls":["10.0.0.2:4222"]}\r\n'
    b"PING\r\n"
    b"MSG a.b 1 5\r\nhello\r\n"
    b"MSG a.reply 2 _INBOX.x 0\r\n\r\n"
    b"HMSG h.s 3 20 25\r\nNATS/1.0\r\nX-A: 1\r\n\r\nworld\r\n"
    b"HMSG h.r 4 r.y 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"
    b"MSG bin 5 6\r\n\r\nMSG \r\n"  # a payload that looks like protocol
    b"+OK\r\n"
    b"PONG\r\n"
    b"-ERR 'Permissions Violation for Publish to \"x.y\"'\r\n"
)
EXPECTED: list[Op] = [
    Info({"server_id": "S1", "max_payload": 1048576, "connect_urls": ["10.0.0.2:4222"]}),
    Ping(),
    Msg("a.b", 1, "", b"hello"),
    Msg("a.reply", 2, "_INBOX.x", b""),
    Msg("h.s", 3, "", b"world"),
    Msg("h.r", 4, "r.y", b"hi"),
    Msg("bin", 5, "", b"\r\nMSG "),
    Ok(),
    Pong(),
    Err('Permissions Violation for Publish to "x.y"'),
]


def parse(chunks: list[bytes]) -> list[Op]:
    parser = Parser()
    out: list[Op] = []
    for chunk in chunks:
        parser.feed(chunk)
        while (op := parser.next()) is not None:
            out.append(op)
    return out


def test_the_whole_stream_at_once() -> None:
    assert parse([STREAM]) == EXPECTED


def test_split_at_every_byte_boundary() -> None:
    for cut in range(1, len(STREAM)):
        assert parse([STREAM[:cut], STREAM[cut:]]) == EXPECTED, cut


def test_one_byte_at_a_time() -> None:
    assert parse([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40))
def test_any_chunking(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    bounds = [0, *points, len(STREAM)]
    chunks = [STREAM[a:b] for a, b in pairwise(bounds)]
    assert parse(chunks) == EXPECTED


@given(st.binary(max_size=300), st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_any_payload_any_chunking(payload: bytes, cuts: list[int]) -> None:
    stream = b"MSG s 9 r " + str(len(payload)).encode() + b"\r\n" + payload + b"\r\nPONG\r\n"
    bounds = [0, *sorted({c for c in cuts if c < len(stream)}), len(stream)]
    chunks = [stream[a:b] for a, b in pairwise(bounds)]
    assert parse(chunks) == [Msg("s", 9, "r", payload), Pong()]


def test_an_operation_is_handed_out_only_once_whole() -> None:
    parser = Parser()
    parser.feed(b"MSG a 1 10\r\n01234")
    assert parser.next() is None
    parser.feed(b"56789\r")
    assert parser.next() is None
    parser.feed(b"\nPI")
    assert parser.next() == Msg("a", 1, "", b"0123456789")
    assert parser.next() is None
    parser.feed(b"NG\r\n")
    assert parser.next() == Ping()


@pytest.mark.parametrize(
    "stream",
    [
        b"HELLO world\r\n",
        b"MSG a 1\r\n",
        b"MSG a x 3\r\nabc\r\n",
        b"MSG a 1 3\r\nabcd\r\n",
        b"HMSG a 1 9 3\r\nabc\r\n",
        b"INFO [1, 2]\r\n",
        b"INFO {nope\r\n",
        b"PING" + b"x" * (70 * 1024),
    ],
)
def test_what_is_not_the_protocol_is_refused(stream: bytes) -> None:
    parser = Parser()
    parser.feed(stream)
    with pytest.raises(ProtocolError):
        parser.next()
