"""Interval reservations of pool memory, as seed 002 has them:
`POST /api/capacity/reservations`, `GET /api/capacity/reservations`,
`GET /api/capacity/calendar`.

Unlike the compute methods these answer validation failures with `400` and a plain text
message, `409 {"error": "capacity_not_available", "intervals": [...]}` when it does not
fit and `409 {"error": "idempotency_key_conflict"}` — the seed's shapes. There is no
cancel, delete or modify route. The handlers here are plain functions; `server.py`
routes them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from coordinator.api.context import Services
from coordinator.api.cursor import decode_cursor, encode_cursor
from coordinator.domain.intervals import (
    INTERVAL_MS,
    IntervalError,
    format_time,
    parse_intervals,
    parse_limit,
    parse_window,
)
from coordinator.domain.model import Pool, Principal
from coordinator.errors import CoordinatorError, IdempotencyKeyConflict
from coordinator.ledger import idempotency
from coordinator.ledger.intervals import Refused
from shared.ids import IDEMPOTENCY_KEY_PATTERN, POOL_ID_PATTERN

_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
_POOL = re.compile(POOL_ID_PATTERN)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: Any  # a JSON value, or str for text/plain

    @property
    def is_text(self) -> bool:
        return isinstance(self.body, str)


def bad(message: str) -> Answer:
    return Answer(400, message + "\n")


class _Stop(Exception):
    def __init__(self, answer: Answer) -> None:
        self.answer = answer


async def _pool(services: Services, who: Principal, wanted: str | None) -> Pool:
    tenant = who.tenant_id
    if wanted is not None:
        if not _POOL.match(wanted):
            raise _Stop(bad("poolId: not a pool id"))
        pool = await services.ledger.pools.get(wanted)
        if pool is None or not pool.visible_to(tenant):
            raise _Stop(Answer(404, f"pool {wanted} not found\n"))
        return pool
    pools = await services.ledger.pools.list_visible(tenant)
    live = [p for p in pools if not p.archived]
    if len(live) != 1:
        raise _Stop(bad(f"poolId is required: tenant {tenant} sees {len(live)} pools"))
    return live[0]


async def post_reservation(
    services: Services, who: Principal, headers: Mapping[str, str], query: Mapping[str, str],
    raw: bytes,
) -> Answer:  # fmt: skip
    """Commit capacity to one or more 15-minute intervals, all or nothing."""
    now = services.clock.now_ms()
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError):
        return bad("body is not valid JSON")
    key = headers.get("Idempotency-Key")
    if key is not None and not _KEY.match(key):
        return bad("Idempotency-Key: at most 128 of A-Z a-z 0-9 . _ : -")
    try:
        intervals = parse_intervals(body, now)
        wanted = query.get("poolId") or (body.get("poolId") if isinstance(body, dict) else None)
        if wanted is not None and not isinstance(wanted, str):
            return bad("poolId: must be a string")
        pool = await _pool(services, who, wanted)
    except IntervalError as exc:
        return bad(str(exc))
    except _Stop as stop:
        return stop.answer
    digest = idempotency.body_hash(body)
    repo = services.ledger.intervals
    quarters = [iv.starts_at for iv in intervals]
    seen = await repo.reservable(who.tenant_id, pool.pool_id, quarters)
    try:
        out = await repo.create(who.tenant_id, pool.pool_id, intervals, seen, key, digest, now)
    except IdempotencyKeyConflict as exc:
        return Answer(409, {"error": "idempotency_key_conflict", "message": exc.message})
    if isinstance(out, idempotency.Recorded):
        return Answer(out.status, out.response)
    if isinstance(out, Refused):
        refused = {"error": "capacity_not_available", "intervals": list(out.failures)}
        if key is not None:
            try:
                recorded = await idempotency.record_once(
                    services.ledger.db, who.tenant_id, "capacity.reservations", key, digest,
                    409, refused, now,
                )  # fmt: skip
            except IdempotencyKeyConflict as exc:
                return Answer(409, {"error": "idempotency_key_conflict", "message": exc.message})
            return Answer(recorded.status, recorded.response)
        return Answer(409, refused)
    services.capacity.notify()
    return Answer(200, out.to_api())


async def list_reservations(
    services: Services, who: Principal, headers: Mapping[str, str], query: Mapping[str, str],
    raw: bytes,
) -> Answer:  # fmt: skip
    """The audit list: every interval reservation made in [from, to), newest first."""
    try:
        start, end = parse_window(query.get("from"), query.get("to"), grid=False)
        limit = parse_limit(query.get("limit"))
        before = None
        if query.get("cursor"):
            try:
                created, rid = decode_cursor(query["cursor"])
                before = (int(created), str(rid))
            except (CoordinatorError, TypeError, ValueError):
                return bad("cursor: not a cursor this server issued")
    except IntervalError as exc:
        return bad(str(exc))
    page = await services.ledger.intervals.page(who.tenant_id, start, end, before, limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return Answer(
        200,
        {
            "from": format_time(start),
            "to": format_time(end),
            "reservations": [r.to_api() for r in page],
            "nextCursor": encode_cursor([page[-1].created_at, page[-1].reservation_id])
            if more
            else None,
        },
    )


async def calendar(
    services: Services, who: Principal, headers: Mapping[str, str], query: Mapping[str, str],
    raw: bytes,
) -> Answer:  # fmt: skip
    """Per quarter-hour of [from, to): the tenant's limit, reserved and reservable GB."""
    try:
        start, end = parse_window(query.get("from"), query.get("to"), grid=True)
        pool = await _pool(services, who, query.get("poolId"))
    except IntervalError as exc:
        return bad(str(exc))
    except _Stop as stop:
        return stop.answer
    quarters = list(range(start, end, INTERVAL_MS))
    usage = await services.ledger.intervals.reservable(who.tenant_id, pool.pool_id, quarters)
    return Answer(
        200,
        {
            "from": format_time(start),
            "to": format_time(end),
            "poolId": pool.pool_id,
            "intervals": [
                {
                    "startsAt": format_time(q),
                    "endsAt": format_time(q + INTERVAL_MS),
                    "reservationLimitGb": usage[q].limit_gb,
                    "reservedGb": usage[q].tenant_gb,
                    "reservableGb": usage[q].reservable,
                }
                for q in quarters
            ],
        },
    )


Handler = Callable[
    [Services, Principal, Mapping[str, str], Mapping[str, str], bytes], Awaitable[Answer]
]

# Declared once: the server routes these and the OpenAPI document lists them.
ROUTES: tuple[tuple[str, str, Handler, str], ...] = (
    ("POST", "/api/capacity/reservations", post_reservation, "compute:reservations:write"),
    ("GET", "/api/capacity/reservations", list_reservations, "compute:reservations:read"),
    ("GET", "/api/capacity/calendar", calendar, "compute:reservations:read"),
)
