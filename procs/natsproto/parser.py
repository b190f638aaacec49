"""Reading the NATS server's side of the protocol: an incremental parser fed whatever
chunks the socket gives (`Parser.feed`), which hands back one whole operation at a time
(`Parser.next`): INFO, MSG, HMSG (its headers skipped), PING, PONG, +OK and -ERR.
Anything else is a `ProtocolError`: the link is not NATS, or is out of step.

It keeps what it has not handed out yet, so a caller may stop after any operation (the
handshake stops at its PONG) and the rest is there for whoever reads on."""

from __future__ import annotations

from typing import Any

import msgspec

from procs.natsproto.errors import ProtocolError

# A control line longer than this is no NATS server's (nats-server's limit is 4 KiB
# plus a subject, and INFO with many connect_urls stays well under it).
MAX_CONTROL_LINE = 64 * 1024


class Info(msgspec.Struct, frozen=True):
    fields: dict[str, Any]


class Msg(msgspec.Struct, frozen=True):
    subject: str
    sid: int
    reply: str
    data: bytes


class Ping(msgspec.Struct, frozen=True):
    pass


class Pong(msgspec.Struct, frozen=True):
    pass


class Ok(msgspec.Struct, frozen=True):
    pass


class Err(msgspec.Struct, frozen=True):
    text: str


Op = Info | Msg | Ping | Pong | Ok | Err

PING, PONG, OK = Ping(), Pong(), Ok()


class Parser:
    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # where the next operation starts in `_buf`

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next(self) -> Op | None:
        """The next whole operation, None until more bytes are fed."""
        buf, pos = self._buf, self._pos
        end = buf.find(b"\r\n", pos)
        if end < 0:
            if len(buf) - pos > MAX_CONTROL_LINE:
                raise ProtocolError("control line too long")
            return None
        line = bytes(buf[pos:end])
        verb, _, rest = line.partition(b" ")
        verb = verb.upper()
        if verb in (b"MSG", b"HMSG"):
            return self._msg(verb == b"HMSG", rest, end + 2)
        self._pos = end + 2
        if verb == b"PING":
            return PING
        if verb == b"PONG":
            return PONG
        if verb == b"+OK":
            return OK
        if verb == b"-ERR":
            return Err(rest.decode(errors="replace").strip().strip("'"))
        if verb == b"INFO":
            try:
                fields = msgspec.json.decode(rest)
            except msgspec.DecodeError as exc:
                raise ProtocolError(f"unreadable INFO: {exc}") from None
            if not isinstance(fields, dict):
                raise ProtocolError("INFO is not an object")
            return Info(fields)
        raise ProtocolError(f"unknown operation {line[:32]!r}")

    def _msg(self, headers: bool, args: bytes, start: int) -> Msg | None:
        """MSG <subject> <sid> [reply] <size>, HMSG ... [reply] <header size> <size>; the
        payload (headers first) and its CRLF follow the control line."""
        parts = args.split()
        try:
            if headers and len(parts) in (4, 5):
                header_size, size = int(parts[-2]), int(parts[-1])
                reply = parts[2] if len(parts) == 5 else b""
            elif not headers and len(parts) in (3, 4):
                header_size, size = 0, int(parts[-1])
                reply = parts[2] if len(parts) == 4 else b""
            else:
                raise ValueError
            sid = int(parts[1])
        except ValueError:
            raise ProtocolError(f"malformed {'HMSG' if headers else 'MSG'} {args[:64]!r}") from None
        if not 0 <= header_size <= size:
            raise ProtocolError(f"malformed message sizes {args[:64]!r}")
        if len(self._buf) < start + size + 2:
            return None  # the payload is still on its way
        if self._buf[start + size : start + size + 2] != b"\r\n":
            raise ProtocolError("message payload not followed by CRLF")
        data = bytes(self._buf[start + header_size : start + size])
        self._pos = start + size + 2
        return Msg(parts[0].decode(), sid, reply.decode(), data)
