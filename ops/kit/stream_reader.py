"""Reading what a JetStream stream holds without a consumer: batched direct gets
(`$JS.API.DIRECT.GET.<stream>` with `batch`, nats-server 2.11+, on a stream that
allows direct get). Readers and forwarders read the alert stream's history this way,
since their NATS users may create no consumer but, for a forwarder, the one named
after it.

Each batch is one request whose answers arrive on an inbox of the caller's (under its
own inbox prefix): the messages, then an end-of-batch status (204) that says how many
matching messages are left, or 404 when none is at or after the asked sequence.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import nats.errors
from nats.aio.client import Client

from ops.kit.errors import OpsError

BATCH = 500


class StreamReadError(OpsError, nats.errors.Error):
    """The server refused a direct get (not a 404: say, the stream has no direct get);
    a NATS error to callers that retry those."""


@dataclass(frozen=True)
class StoredMsg:
    seq: int
    subject: str
    data: bytes


async def read_stream(
    nc: Client,
    stream: str,
    subject: str,
    *,
    start_seq: int = 1,
    start_time_ms: int | None = None,
    upto_seq: int | None = None,
    batch: int = BATCH,
    timeout_s: float = 5.0,
) -> AsyncIterator[StoredMsg]:
    """Every message of `stream` on `subject` (wildcards allowed) from `start_seq`, or
    from `start_time_ms` when given, up to `upto_seq` (None: to the end as it is when
    each batch is read), in order. Raises TimeoutError when a batch is not answered in
    `timeout_s` (no responders: a stream without direct get, or none at all)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    request: dict[str, Any] = {"batch": batch, "next_by_subj": subject}
    if start_time_ms is not None:
        start = datetime.fromtimestamp(start_time_ms / 1000, tz=UTC)
        request["start_time"] = start.isoformat().replace("+00:00", "Z")
    else:
        request["seq"] = max(1, start_seq)
    try:
        while True:
            await nc.publish(f"$JS.API.DIRECT.GET.{stream}", json.dumps(request).encode(), inbox)
            last = 0
            while True:
                msg = await sub.next_msg(timeout=timeout_s)
                headers = msg.headers or {}
                status = headers.get("Status")
                if status == "404":
                    return
                if status == "204":
                    break
                if status:
                    raise StreamReadError(f"direct get on {stream}: status {status}")
                last = int(headers["Nats-Sequence"])
                if upto_seq is not None and last > upto_seq:
                    return
                yield StoredMsg(last, headers.get("Nats-Subject", ""), msg.data)
                if upto_seq is not None and last >= upto_seq:
                    return
            if not last or headers.get("Nats-Num-Pending") == "0":
                return
            request = {"batch": batch, "next_by_subj": subject, "seq": last + 1}
    finally:
        try:
            await sub.unsubscribe()
        except nats.errors.Error:
            pass  # the connection is gone: so is the subscription
