"""Raw TCP connections in tests, closed so that nothing outlives its test."""

from __future__ import annotations

import asyncio
import contextlib


async def closed(writer: asyncio.StreamWriter) -> None:
    """Close a test's connection and wait until its socket is: a socket still open when
    the test's loop ends is finalized during a later test, as a ResourceWarning there."""
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
