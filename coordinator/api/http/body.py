"""A request body as the API accepts it: read whole (within a size limit and a time
limit, however the client splits it into TCP writes or chunks), then JSON decoded
strictly — no duplicate keys, no NaN/Infinity, bounded nesting, no NUL bytes and no
lone surrogates in any string.

Strictness here is what keeps hostile input from reaching the ledger: PostgreSQL
refuses NUL in text, a lone surrogate cannot be encoded for hashing or storage, and a
deeply nested document exhausts the recursion limit. Each is a clear 400 before any
work is done, never a 500 after some of it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

MAX_DEPTH = 32


class BodyError(ValueError):
    """The body is not acceptable JSON; the message says why (and where)."""


class TooLarge(BodyError):
    pass


class TooSlow(BodyError):
    pass


class Readable(Protocol):
    async def readany(self) -> bytes: ...


async def read_whole(stream: Readable, declared: int | None, limit: int, timeout_s: float) -> bytes:
    """Every byte of the body, or `TooLarge` as soon as it passes `limit` (whatever
    `Content-Length` said, or with none: chunked), or `TooSlow` after `timeout_s`."""
    if declared is not None and declared > limit:
        raise TooLarge(f"request body is over {limit} bytes")
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                chunk = await stream.readany()
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise TooLarge(f"request body is over {limit} bytes")
                parts.append(chunk)
    except TimeoutError:
        raise TooSlow(f"request body not received within {timeout_s:g} s") from None
    return b"".join(parts)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BodyError(f"duplicate key {_shown(key)}")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise BodyError(f"{name} is not a JSON number")


def _shown(text: str) -> str:
    return json.dumps(text[:64])


def _check_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise BodyError(f"{where}: NUL bytes are not allowed in strings")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BodyError(f"{where}: lone surrogates are not allowed in strings") from None


def check_text(text: str, where: str) -> None:
    """A query parameter or header value: the same rules as strings in a body."""
    _check_text(text, where)


def strict_json(raw: bytes | str) -> Any:
    """Decode with the rules above; `BodyError` says which one broke."""
    try:
        value = json.loads(raw, object_pairs_hook=_pairs, parse_constant=_constant)
    except BodyError:
        raise
    except RecursionError:
        raise BodyError("JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(f"body is not valid JSON: {exc}") from None
    _walk(value)
    return value


def _walk(value: Any) -> None:
    # Iterative, so a document nested just below the decoder's limit cannot blow ours.
    stack: list[tuple[Any, str, int]] = [(value, "(body)", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BodyError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, str):
            _check_text(item, where)
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise BodyError(f"{where}: number out of range")
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key, f"{where} key")
                stack.append((child, key if where == "(body)" else f"{where}.{key}", depth + 1))
        elif isinstance(item, list):
            for i, child in enumerate(item):
                stack.append((child, f"{where}[{i}]", depth + 1))
