"""Opening one link to one server: TCP, the server's INFO, TLS when the server or the
URL asks for it (or the client was given a TLS context: it then refuses clear text),
CONNECT (with the client's credentials, else the URL's), and a PING whose PONG says the
server took us (an `-ERR` instead says why not: a refused password is an
`AuthorizationError`).

The whole of it runs under one deadline (`asyncio.timeout`, not `wait_for`: Python
3.11's `wait_for` can lose a connection that completes just as it is cancelled, and the
socket with it). Until the link is handed back, this module owns the socket and closes
it on every way out: an error, the deadline, a cancellation."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import SplitResult, unquote

import msgspec

from procs.natsproto.auth import Credentials
from procs.natsproto.errors import AuthorizationError, ProtocolError, ServerError
from procs.natsproto.parser import Err, Info, Op, Parser, Ping, Pong
from procs.natsproto.servers import Server

READ_CHUNK = 64 * 1024
# Bound on waiting for a closed socket's last callbacks: it closes at once on loopback.
CLOSE_WAIT_S = 1.0


class Hello(msgspec.Struct, frozen=True):
    """What CONNECT says besides credentials."""

    name: str
    version: str
    credentials: Credentials = msgspec.field(default_factory=Credentials)
    tls: ssl.SSLContext | None = None


class Opened(msgspec.Struct):
    """A link the server took: its streams, its INFO, and the parser holding whatever
    the server sent after its PONG."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    info: dict[str, Any]
    parser: Parser
    tls: bool


async def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close a link's socket now (abort: nothing pending is worth a wait) and wait,
    briefly, until asyncio has released it."""
    writer.transport.abort()
    try:
        async with asyncio.timeout(CLOSE_WAIT_S):
            await writer.wait_closed()
    except (OSError, TimeoutError, ssl.SSLError):
        pass  # it is closed: how the peer took it is no concern of ours


async def _next_op(reader: asyncio.StreamReader, parser: Parser) -> Op:
    while True:
        op = parser.next()
        if op is not None:
            return op
        data = await reader.read(READ_CHUNK)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        parser.feed(data)


def _refusal(text: str) -> ServerError:
    if "authorization violation" in text.lower():
        return AuthorizationError(text)
    return ServerError(text)


def connect_command(hello: Hello, info: dict[str, Any], tls: bool, url: SplitResult) -> bytes:
    fields: dict[str, Any] = {
        "verbose": False,
        "pedantic": False,
        "tls_required": tls,
        "name": hello.name,
        "lang": "python3",
        "version": hello.version,
        "protocol": 1,
        "headers": False,
        "echo": True,
    }
    nonce = info.get("nonce")
    given = hello.credentials.connect_fields(nonce if isinstance(nonce, str) else None)
    fields.update(given or url_credentials(url))
    return b"CONNECT " + msgspec.json.encode(fields) + b"\r\nPING\r\n"


def url_credentials(url: SplitResult) -> dict[str, Any]:
    """What a URL's `user:password@` (or a lone `token@`) says, as nats-py reads it;
    used only when no credentials were given otherwise."""
    if not url.username:
        return {}
    if url.password is None:
        return {"auth_token": unquote(url.username)}
    return {"user": unquote(url.username), "pass": unquote(url.password)}


async def _greet(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server, hello: Hello
) -> tuple[asyncio.StreamReader, Opened]:
    parser = Parser()
    op = await _next_op(reader, parser)
    if not isinstance(op, Info):
        raise ProtocolError(f"expected INFO, got {type(op).__name__}")
    info = op.fields
    tls = server.tls or hello.tls is not None or bool(info.get("tls_required"))
    if tls:
        context = hello.tls or ssl.create_default_context()
        await writer.start_tls(context, server_hostname=server.host)
    writer.write(connect_command(hello, info, tls, server.uri))
    await writer.drain()
    while True:
        op = await _next_op(reader, parser)
        if isinstance(op, Pong):
            return reader, Opened(reader, writer, info, parser, tls)
        if isinstance(op, Err):
            raise _refusal(op.text)
        if isinstance(op, Ping):
            writer.write(b"PONG\r\n")
        # INFO (a cluster update) or +OK: nothing to do before our PONG


async def open_link(server: Server, hello: Hello, timeout_s: float) -> Opened:
    """A link to `server` the server has accepted, within `timeout_s` (TimeoutError)."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                server.host, server.port, limit=READ_CHUNK
            )
            _, opened = await _greet(reader, writer, server, hello)
        writer = None  # handed over: the caller owns the socket now
        return opened
    finally:
        if writer is not None:
            await close_writer(writer)
