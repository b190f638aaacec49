"""A gpufleet process's `NatsSettings` as this client's options: the seeds, the
credentials file read now (`procs.nats.auth_options`: a JWT `.creds` file, or the
user/password TOML `gpufleet nats-auth` writes; CredentialsError names
`nats_credentials`) and the client TLS context (`procs.nats.tls_context`)."""

from __future__ import annotations

from typing import Any

from procs.nats import NatsSettings, auth_options, tls_context
from procs.natsproto.auth import Credentials
from procs.natsproto.client import ClientOptions


def credentials_for(options: dict[str, Any]) -> Credentials:
    """`auth_options`' nats-py keywords as Credentials. Its `inbox_prefix` has no use
    here: this client sends no requests, so it never subscribes to an inbox."""
    if "user_credentials" in options:
        return Credentials(creds_path=str(options["user_credentials"]))
    if "user" in options:
        return Credentials(user=options["user"], password=options["password"])
    return Credentials()


def client_options(settings: NatsSettings, **options: Any) -> ClientOptions:
    """ClientOptions for `settings` and the process's own `options` (name, callbacks,
    timings: `ClientOptions`' fields); ValueError when the URL holds no server."""
    return ClientOptions(
        servers=settings.servers,
        credentials=credentials_for(auth_options(settings.credentials)),
        tls=tls_context(settings.tls_ca, settings.tls_cert, settings.tls_key),
        **options,
    )
