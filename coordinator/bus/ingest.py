"""Heartbeat and inventory ingestion: size check, subject parse, compiled pydantic
validation, subject/payload agreement — then hand the value to a sink.

A bad message is dropped and counted by reason; it never raises out of the callback,
so one bad host cannot stall ingestion for the others. Each drop is logged at warning
with the node id when the subject names one, at most once per reason per period
(`coordinator.log_throttle`); `dropped` has the exact counts for the metrics.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Protocol

from nats.aio.msg import Msg
from pydantic import ValidationError

from coordinator.log_throttle import LogThrottle
from shared.subjects import Subjects
from shared.wire import MAX_HEARTBEAT_BYTES, MAX_INVENTORY_BYTES, Heartbeat, Inventory

log = logging.getLogger(__name__)


class IngestSink(Protocol):
    def on_heartbeat(self, hb: Heartbeat) -> None: ...

    def on_inventory(self, inv: Inventory) -> None: ...


class Ingest:
    def __init__(self, subjects: Subjects, sink: IngestSink) -> None:
        self.subjects = subjects
        self.sink = sink
        self.accepted: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        # Each node publishes on the same two subjects forever: parse each subject once.
        self._parsed: dict[str, tuple[str, str, str] | None] = {}
        self._throttle = LogThrottle(log)

    def drop(self, reason: str, subject: str, detail: str = "") -> None:
        self.dropped[reason] += 1
        parsed = self._parse(subject)
        node = parsed[2] if parsed is not None else "?"
        self._throttle.warning(
            reason, "dropped a message from node %s on %s: %s %s", node, subject, reason, detail
        )

    async def on_message(self, msg: Msg) -> None:
        try:
            self.handle(msg.subject, msg.data)
        except Exception:
            self.drop("internal", msg.subject)
            log.exception("ingest failed on %s", msg.subject)

    def _parse(self, subject: str) -> tuple[str, str, str] | None:
        try:
            return self._parsed[subject]
        except KeyError:
            if len(self._parsed) > 1_000_000:
                self._parsed.clear()
            parsed = self._parsed[subject] = self.subjects.parse_node_subject(subject)
            return parsed

    def handle(self, subject: str, data: bytes) -> None:
        parsed = self._parse(subject)
        if parsed is None or parsed[0] not in ("hb", "inv"):
            self.drop("bad_subject", subject)
            return
        kind, pool_id, node_id = parsed
        limit = MAX_HEARTBEAT_BYTES if kind == "hb" else MAX_INVENTORY_BYTES
        if len(data) > limit:
            self.drop("too_large", subject, f"{len(data)} bytes")
            return
        model: type[Heartbeat] | type[Inventory] = Heartbeat if kind == "hb" else Inventory
        try:
            value = model.model_validate_json(data)
        except ValidationError as exc:
            reason = "not_json" if exc.errors()[0]["type"] == "json_invalid" else "bad_schema"
            self.drop(reason, subject, str(exc.errors()[0]["msg"]))
            return
        if value.node_id != node_id or value.pool_id != pool_id:
            self.drop("subject_mismatch", subject, f"payload says {value.pool_id}/{value.node_id}")
            return
        if isinstance(value, Heartbeat):
            self.accepted["hb"] += 1
            self.sink.on_heartbeat(value)
        else:
            self.accepted["inv"] += 1
            self.sink.on_inventory(value)
