"""How every gpufleet process reaches NATS: the server list it is given (one URL or
comma-separated seeds, `split_servers`), its credentials file (`auth_options`: a NATS
JWT `.creds` file is handed to nats-py as is; anything else must be the user/password
TOML that `gpufleet nats-auth` writes) and its client TLS (`tls_context`). The
connection itself is `procs.nats_connect` (this module does not import nats-py, so
settings models and the CLI stay light)."""

from __future__ import annotations

import re
import ssl
import tomllib
from typing import Annotated, Any
from urllib.parse import urlsplit

from msgspec import Meta

JWT_CREDS_MARKER = "-----BEGIN NATS USER JWT-----"

# The NATS settings every process's model has, declared once (as `nats_url`,
# `nats_credentials`, `subject_prefix`; a model adds its own checks with an Option).
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
CredentialsFile = Annotated[
    str | None, Meta(description="NATS credentials file (`.creds` or `gpufleet nats-auth` TOML)")
]
SubjectPrefix = Annotated[str, Meta(description="NATS subject prefix")]
# The link probe's timing (`procs.nats_link`), the same settings in every process that
# runs it (`nats_probe_interval_s`, `nats_probe_timeout_s`): a hung server is noticed in
# about their sum.
ProbeInterval = Annotated[
    float, Meta(gt=0, le=60, description="seconds between NATS round-trip probes")
]
ProbeTimeout = Annotated[
    float,
    Meta(
        gt=0,
        le=60,
        description="seconds without an answer to a probe before the NATS link is taken as dead",
    ),
]
DEFAULT_PROBE_INTERVAL_S = 1.0
DEFAULT_PROBE_TIMEOUT_S = 2.0


class CredentialsError(ValueError):
    pass


def parse_credentials(text: str, where: str = "credentials") -> tuple[str, str]:
    """(user, password) from a credentials file written by `gpufleet nats-auth`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CredentialsError(f"{where}: not a gpufleet credentials file: {exc}") from None
    user, password = data.get("user"), data.get("password")
    if not isinstance(user, str) or not user or not isinstance(password, str) or not password:
        raise CredentialsError(f"{where}: needs user and password strings")
    return user, password


def connect_options(text: str, path: str, where: str) -> dict[str, Any]:
    """nats-py connect keyword arguments for the credentials file at `path`."""
    if JWT_CREDS_MARKER in text:
        return {"user_credentials": path}
    user, password = parse_credentials(text, where)
    options: dict[str, Any] = {"user": user, "password": password}
    # A user allowed replies only under a prefix of its own (`gpufleet nats-auth`
    # writes it for readers and forwarders) must ask for them there.
    prefix = tomllib.loads(text).get("inbox_prefix")
    if prefix is not None:
        if not isinstance(prefix, str) or not re.fullmatch(r"[^\s.*>]+", prefix):
            raise CredentialsError(f"{where}: inbox_prefix must be one subject token")
        options["inbox_prefix"] = prefix
    return options


def auth_options(path: str | None, where: str = "nats_credentials") -> dict[str, Any]:
    """nats-py connect options for the credentials file at `path` (none: {}), read now;
    CredentialsError names `where` when it cannot be read or is not a credentials file."""
    if not path:
        return {}
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        raise CredentialsError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    return connect_options(text, path, where)


def tls_context(
    ca: str | None, cert: str | None = None, key: str | None = None
) -> ssl.SSLContext | None:
    """A client TLS context that verifies servers against `ca` (the system's store when
    None) and presents `cert`/`key` when given; None when no TLS setting is made."""
    if ca is None and cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


SCHEMES = ("nats", "tls", "ws", "wss")
_URL = re.compile(r"^(nats|tls|ws|wss)://[^\s/,]+/?$")


def split_servers(value: str) -> list[str]:
    """The seeds of a `nats_url` setting, in the order given; ValueError names the first
    one that is not a `nats://host:port` URL."""
    servers = [part.strip() for part in value.split(",")]
    if not any(servers):
        raise ValueError("no NATS server URL given")
    for url in servers:
        if not _URL.match(url):
            raise ValueError(f"{url!r} is not a nats://host:port URL")
        parts = urlsplit(url)
        try:
            port = parts.port  # urllib refuses a port that is not 0..65535
        except ValueError:
            raise ValueError(f"{url!r} has no valid port") from None
        if not parts.hostname or port == 0:
            raise ValueError(f"{url!r} needs a host and a port other than 0")
    return servers
