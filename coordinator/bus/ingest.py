"""Heartbeat, inventory and use-report ingestion: size check, subject parse, decoding by the wire
model itself (`shared.wire`, a msgspec decoder compiled once per kind), subject/payload
agreement — then hand the value to a sink.

A bad message is dropped and counted by reason; it never raises out of the callback,
so one bad host cannot stall ingestion for the others. Each node id has its own rate
limit (`coordinator.domain.rate_limit`): a flood on one node's subjects is dropped as
`rate_limited` before it is parsed, and degrades only that node. The callback yields
to the event loop every few messages, so a burst cannot starve the API, the sweep or
the backlog check that tells liveness we are behind. Each drop is logged at warning
with the node id when the subject names one, at most once per reason per period
(`procs.log_throttle`); `dropped` has the exact counts for the metrics, messages the
NATS client dropped as a slow consumer included (`slow_consumer`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
from nats.aio.msg import Msg

from coordinator.domain.rate_limit import RateLimiter
from procs.log_throttle import LogThrottle
from shared.subjects import Subjects
from shared.wire import (
    MAX_HEARTBEAT_BYTES,
    MAX_INVENTORY_BYTES,
    Heartbeat,
    Inventory,
    UseReport,
)

log = logging.getLogger(__name__)


class IngestSink(Protocol):
    def on_heartbeat(self, hb: Heartbeat) -> None: ...

    def on_inventory(self, inv: Inventory) -> None: ...

    def on_use_report(self, report: UseReport) -> None: ...


_HEARTBEAT = msgspec.json.Decoder(Heartbeat)
_INVENTORY = msgspec.json.Decoder(Inventory)
_USE = msgspec.json.Decoder(UseReport)
_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    "hb": _HEARTBEAT,
    "inv": _INVENTORY,
    "use": _USE,
}

# A subject parsed: (kind, pool id, node id); the payload's ids are checked against the
# wire's patterns, and must equal these.
Parsed = tuple[str, str, str]


class Ingest:
    def __init__(
        self,
        subjects: Subjects,
        sink: IngestSink,
        limiter: RateLimiter | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.subjects = subjects
        self.sink = sink
        self.limiter = limiter or RateLimiter(rate=20.0, burst=100)
        self._monotonic = monotonic
        self.accepted: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        # Each node publishes on the same two subjects forever: parse each subject once.
        self._parsed: dict[str, Parsed | None] = {}
        self._throttle = LogThrottle(log)

    def drop(self, reason: str, subject: str, detail: str = "") -> None:
        self.dropped[reason] += 1
        parsed = self._parse(subject)
        node = parsed[2] if parsed is not None else "?"
        self._throttle.warning(
            reason, "dropped a message from node %s on %s: %s %s", node, subject, reason, detail
        )

    def lost(self, subject: str) -> None:
        """The NATS client dropped a message on `subject` as a slow consumer (its queue
        was full): one of ours is counted as dropped (`slow_consumer`), so what was
        sent is what was processed or counted. The client logs it."""
        parsed = self._parse(subject)
        if parsed is not None and parsed[0] in _DECODERS:
            self.dropped["slow_consumer"] += 1

    def on_message(self, msg: Msg) -> None:
        """One message; never raises (the bus calls it for a batch at a time, and one bad
        message must not cost the rest of the batch)."""
        subject = msg.subject
        try:
            self.handle(subject, msg.data)
        except Exception:
            self.drop("internal", subject)
            log.exception("ingest failed on %s", subject)

    def _parse(self, subject: str) -> Parsed | None:
        try:
            return self._parsed[subject]
        except KeyError:
            if len(self._parsed) > 100_000:
                self._parsed.clear()
            parsed = self._parsed[subject] = self.subjects.parse_node_subject(subject)
            return parsed

    def handle(self, subject: str, data: bytes) -> None:
        parsed = self._parse(subject)
        if parsed is None or parsed[0] not in _DECODERS:
            self.drop("bad_subject", subject)
            return
        kind, pool_id, node_id = parsed
        if not self.limiter.allow(node_id, self._monotonic()):
            self.drop("rate_limited", subject)
            return
        limit = MAX_HEARTBEAT_BYTES if kind == "hb" else MAX_INVENTORY_BYTES
        if len(data) > limit:
            self.drop("too_large", subject, f"{len(data)} bytes")
            return
        try:
            value: Heartbeat | Inventory | UseReport = _DECODERS[kind].decode(data)
        except msgspec.ValidationError as exc:
            self.drop("bad_schema", subject, str(exc))  # names the field: "at `$.seq`"
            return
        except msgspec.DecodeError as exc:
            self.drop("not_json", subject, str(exc))
            return
        if value.node_id != node_id or value.pool_id != pool_id:
            self.drop("subject_mismatch", subject, f"payload says {value.pool_id}/{value.node_id}")
            return
        if isinstance(value, Heartbeat):
            self.accepted["hb"] += 1
            self.sink.on_heartbeat(value)
        elif isinstance(value, Inventory):
            self.accepted["inv"] += 1
            self.sink.on_inventory(value)
        else:
            self.accepted["use"] += 1
            self.sink.on_use_report(value)
