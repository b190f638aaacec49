"""`gpufleet alerts watch`: follow the alerts the coordinator keeps in its JetStream
stream (`<PREFIX>_ALERTS`, subjects `<prefix>.alert.<pool>.<node>.<kind>`), from a
point in time or from now, optionally for one pool, printing each as it comes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ops.kit.errors import OpsError
from ops.kit.server_text import shown
from procs.nats import CredentialsError, NatsSettings
from procs.redact import redact
from shared.streams import stream_name
from shared.subjects import Subjects


class FeedError(OpsError):
    """The feed could not start: NATS unreachable, no stream, bad credentials."""


@dataclass(frozen=True)
class Feed:
    nats: NatsSettings
    pool_id: str | None = None
    since_ms: int | None = None  # None: only alerts from now on
    count: int | None = None  # stop after this many
    idle_s: float | None = None  # stop after this long without one

    @property
    def subject(self) -> str:
        subjects = Subjects(self.nats.subject_prefix)
        if self.pool_id:
            return f"{subjects.prefix}.alert.{self.pool_id}.>"
        return subjects.all_alerts


async def _connect(feed: Feed) -> Any:
    from nats.errors import NoServersError

    from procs.nats_connect import ONCE, connect

    try:
        feed.nats.servers  # noqa: B018  # said before any connect is tried
    except ValueError as exc:
        raise FeedError(f"--nats-url: {exc}") from None
    seen: list[Exception] = []

    async def keep(exc: Exception) -> None:
        """nats-py's default logs each error with its traceback; the last one is said
        in one line instead."""
        seen.append(exc)

    # One try per server (max_reconnect_attempts=0 would mean "forever" to nats-py).
    options = dict(
        connect_timeout=3, max_reconnect_attempts=1, reconnect_time_wait=0.2,
        allow_reconnect=False, error_cb=keep,
    )  # fmt: skip
    try:
        return await connect(feed.nats, options, retry=ONCE)
    except CredentialsError as exc:
        raise FeedError(f"cannot use credentials {feed.nats.credentials}: {exc}") from None
    except Exception as exc:
        last = seen[-1] if seen and isinstance(exc, NoServersError) else exc
        why = str(last) or type(last).__name__
        raise FeedError(f"{redact(feed.nats.url)}: cannot connect to NATS ({why})") from None


async def follow(feed: Feed, show: Callable[[dict[str, Any]], None]) -> int:
    """Print alerts until `count` or `idle_s` says stop; returns how many were shown.

    Live alerts come on core NATS, and those since `since_ms` from the stream by direct
    get (a reader's NATS user may create no consumer): the live subscription starts
    first, so none falls between the two, and an alert read from the stream is not shown
    again when it also arrives live."""
    import nats.errors

    from ops.kit.stream_reader import read_stream

    nc = await _connect(feed)
    try:
        stream = stream_name(feed.nats.subject_prefix)
        live = await nc.subscribe(feed.subject)
        try:
            info = await nc.jetstream(timeout=5).stream_info(stream)
        except Exception as exc:
            raise FeedError(
                f"{redact(feed.nats.url)}: no alert stream {stream} ({exc or type(exc).__name__}); "
                "is --subject-prefix the coordinator's?"
            ) from None
        shown = 0
        stored: set[str] = set()  # alert ids shown from the stream
        if feed.since_ms is not None:
            try:
                async for msg in read_stream(
                    nc, stream, feed.subject, start_time_ms=feed.since_ms,
                    upto_seq=info.state.last_seq,
                ):  # fmt: skip
                    if feed.count is not None and shown >= feed.count:
                        return shown
                    alert = _alert(msg.data)
                    if alert is not None:
                        stored.add(str(alert.get("alertId")))
                        show(alert)
                        shown += 1
            except (nats.errors.Error, TimeoutError) as exc:
                raise FeedError(
                    f"{redact(feed.nats.url)}: cannot read {stream} ({exc or type(exc).__name__})"
                ) from None
        while feed.count is None or shown < feed.count:
            try:
                live_msg = await asyncio.wait_for(live.next_msg(timeout=None), feed.idle_s)
            except TimeoutError:
                break
            alert = _alert(live_msg.data)
            if alert is None or str(alert.get("alertId")) in stored:
                continue
            show(alert)
            shown += 1
        return shown
    finally:
        try:
            await asyncio.wait_for(nc.close(), 5)
        except Exception:  # closing a dead connection: nothing left to release
            pass


def _alert(data: bytes) -> dict[str, Any] | None:
    try:
        alert = json.loads(data)
    except ValueError:
        return None
    return alert if isinstance(alert, dict) else None


def alert_line(alert: dict[str, Any], when: str) -> str:
    """One alert as a line for a terminal; what its publisher said is shown inert
    (`ops.kit.server_text`): owners and reasons come from agents and processes."""
    return shown(_line(alert, when))


def _line(alert: dict[str, Any], when: str) -> str:
    parts = [when, str(alert.get("kind", "?")), str(alert.get("nodeId", "-"))]
    if alert.get("deviceId"):
        parts.append(f"device={alert['deviceId']}")
    if alert.get("reservationId"):
        parts.append(f"reservation={alert['reservationId']}")
    parts.append(f"pool={alert.get('poolId', '-')}")
    if alert.get("reason"):
        parts.append(f"— {alert['reason']}")
    return "  ".join(parts)
