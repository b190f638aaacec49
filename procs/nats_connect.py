"""Connecting to NATS, the same for every gpufleet process: nats-py's client for the
process's `NatsSettings` (its seeds, credentials and TLS, `NatsSettings.client_options`)
with the process's own options (name, callbacks, pings), nats-py reconnecting forever
once connected, and the first connect retried here, since a daemon may start before
NATS (`Retry`: how often, how long between tries)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client

from procs.nats import NatsSettings
from procs.redact import redact

# What a failed first connect raises: no server answered, not in time, or refused us.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (OSError, TimeoutError, nats.errors.Error)

# Once connected, every process lets nats-py reconnect for ever.
RECONNECT_FOREVER: dict[str, Any] = {"allow_reconnect": True, "max_reconnect_attempts": -1}


class Retry(msgspec.Struct, frozen=True):
    """The first connect: tried `attempts` times (0: until cancelled), `first_s` apart,
    the wait doubling up to `max_s`; only `errors` are retried."""

    first_s: float = 1.0
    max_s: float = 1.0
    attempts: int = 0
    errors: tuple[type[BaseException], ...] = CONNECT_ERRORS


ONCE = Retry(attempts=1)
FOREVER = Retry()  # until cancelled, 1 s apart


async def connect(
    nats: NatsSettings,
    options: Mapping[str, Any],
    *,
    retry: Retry = FOREVER,
    log: logging.Logger | None = None,
    client: Client | None = None,
    on_failure: Callable[[BaseException], None] | None = None,
) -> Client:
    """A connected client (`client`, or a new one each try) for the servers of `nats`,
    with its credentials (read now: CredentialsError names `nats_credentials`) and TLS,
    and the process's `options` (nats-py's keywords). A failed try that is retried goes
    to `on_failure` (a process that words its own: refused or unreachable, throttled),
    else is logged at warning on `log`; ValueError when `nats.url` holds no server URL."""
    servers = nats.servers
    options = {**nats.client_options(), **options}
    delay = retry.first_s
    tried = 0
    while True:
        tried += 1
        nc = client if client is not None else Client()
        try:
            await nc.connect(servers=servers, **options)
            return nc
        except retry.errors as exc:
            if retry.attempts and tried >= retry.attempts:
                raise
            if on_failure is not None:
                on_failure(exc)
            elif log is not None:
                log.warning(
                    "NATS at %s not reachable (%s); retrying in %.1fs",
                    redact(",".join(servers)), exc, delay,
                )  # fmt: skip
            await asyncio.sleep(delay)
            delay = min(delay * 2, retry.max_s)
