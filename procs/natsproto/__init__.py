"""The agent's own core NATS client (no nats-py): the protocol's server side parsed
(`parser`), a link opened, TLS-upgraded and authenticated (`handshake`, `auth`), one
live link read and pinged (`link`), subscriptions and the one task running their
callbacks (`subscription`), the server pool (`servers`) and the client that reconnects
for ever (`client`). Errors share one root (`errors.NatsError`).

Only core NATS: publish, subscribe, flush; no JetStream, no requests of its own, no
headers. The coordinator, the forwarder and the Slurm bridge keep nats-py."""

from __future__ import annotations

from procs.natsproto.auth import Credentials
from procs.natsproto.client import Client, ClientOptions
from procs.natsproto.errors import AuthorizationError, NatsError, NotConnectedError
from procs.natsproto.servers import Server
from procs.natsproto.subscription import Msg

__all__ = [
    "AuthorizationError",
    "Client",
    "ClientOptions",
    "Credentials",
    "Msg",
    "NatsError",
    "NotConnectedError",
    "Server",
]
