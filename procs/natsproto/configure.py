"""A gpufleet process's `NatsSettings` as this client's options: the seeds, who the
process is (`procs.nats.read_identity`, read now: a JWT `.creds` file, or the
user/password TOML `gpufleet nats-auth` writes; CredentialsError names
`nats_credentials`) and the client TLS context (`procs.nats.tls_context`)."""

from __future__ import annotations

from typing import Any

from procs.nats import NatsIdentity, NatsSettings, read_identity, tls_context
from procs.natsproto.auth import Credentials
from procs.natsproto.client import ClientOptions


def credentials_for(identity: NatsIdentity) -> Credentials:
    """The identity as this client's Credentials. Its `inbox_prefix` has no use here:
    this client sends no requests, so it never subscribes to an inbox."""
    return Credentials(
        user=identity.user, password=identity.password, creds_path=identity.creds_path
    )


def client_options(settings: NatsSettings, **options: Any) -> ClientOptions:
    """ClientOptions for `settings` and the process's own `options` (name, callbacks,
    timings: `ClientOptions`' fields); ValueError when the URL holds no server."""
    return ClientOptions(
        servers=settings.servers,
        credentials=credentials_for(read_identity(settings.credentials)),
        tls=tls_context(settings.tls_ca, settings.tls_cert, settings.tls_key),
        **options,
    )
