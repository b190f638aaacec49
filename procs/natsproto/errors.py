"""What the agent's NATS client raises: one root (`NatsError`), and a class for each
failure a caller tells apart (refused credentials, no link, a protocol it cannot read)."""

from __future__ import annotations


class NatsError(Exception):
    """Root of every error `procs.natsproto` raises."""


class ProtocolError(NatsError):
    """The server sent something that is not the NATS client protocol."""


class ServerError(NatsError):
    """An `-ERR` from the server; the text is the server's, quotes stripped (say,
    "Permissions Violation for Publish to ...")."""

    def __init__(self, text: str) -> None:
        super().__init__(f"nats: {text}")
        self.text = text


class AuthorizationError(ServerError):
    """The server refused this client's credentials ("Authorization Violation")."""


class NotConnectedError(NatsError):
    """No link to a server now (not yet connected, reconnecting, or closed)."""


class OutboundBufferFullError(NatsError):
    """More is waiting to be written to the server than the client holds."""


class ClosedError(NotConnectedError):
    """The client was closed."""
