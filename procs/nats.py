"""How every gpufleet process reaches NATS: its settings, declared once (`NatsSettings`,
nested as `nats` in each process's settings model; `ProbedNatsSettings` where the
process probes its link, `procs.nats_link`), the server list it is given (one URL or
comma-separated seeds, `split_servers`), who it is to the servers (`read_identity`: a
NATS JWT `.creds` file, kept as its path, or the user/password TOML that `gpufleet
nats-auth` writes, read into a `NatsIdentity` that either client takes) and its client
TLS (`tls_context`). The connection itself is `procs.nats_connect` (nats-py), or for
the agent its own client `procs.natsproto` (`procs.natsproto.configure`); this module
imports neither, so settings models and the CLI stay light."""

from __future__ import annotations

import re
import ssl
import tomllib
from pathlib import Path
from typing import Annotated, Any, Protocol
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from procs.redact import redact
from procs.settings.model import ConfigError, Option, SettingsGroup
from shared.subjects import DEFAULT_PREFIX, Subjects

JWT_CREDS_MARKER = "-----BEGIN NATS USER JWT-----"

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
# The link probe's timing (`procs.nats_link`): a hung server is noticed in about their sum.
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


class NatsIdentity(msgspec.Struct, frozen=True):
    """Who a process is to NATS, as its credentials file says: a NATS JWT `.creds` file
    (its path: clients read it at each connect, so a rotated file is picked up), or a
    user and password, with the inbox prefix its replies must use where `gpufleet
    nats-auth` gave it one; nothing at all without a file."""

    creds_path: str | None = None
    user: str | None = None
    password: str | None = None
    inbox_prefix: str | None = None

    def __repr__(self) -> str:  # never the password, in a log or a traceback
        return (
            f"NatsIdentity(creds_path={self.creds_path!r}, user={self.user!r}, "
            f"inbox_prefix={self.inbox_prefix!r})"
        )

    def nats_py(self) -> dict[str, Any]:
        """nats-py's connect keyword arguments for this identity."""
        if self.creds_path is not None:
            return {"user_credentials": self.creds_path}
        options: dict[str, Any] = {}
        if self.user is not None:
            options.update(user=self.user, password=self.password)
        if self.inbox_prefix is not None:
            options["inbox_prefix"] = self.inbox_prefix
        return options


def identity_of(text: str, path: str, where: str) -> NatsIdentity:
    """The identity in the credentials file at `path`, whose content is `text`."""
    if JWT_CREDS_MARKER in text:
        return NatsIdentity(creds_path=path)
    user, password = parse_credentials(text, where)
    # A user allowed replies only under a prefix of its own (`gpufleet nats-auth`
    # writes it for readers and forwarders) must ask for them there.
    prefix = tomllib.loads(text).get("inbox_prefix")
    if prefix is not None and (
        not isinstance(prefix, str) or not re.fullmatch(r"[^\s.*>]+", prefix)
    ):
        raise CredentialsError(f"{where}: inbox_prefix must be one subject token")
    return NatsIdentity(user=user, password=password, inbox_prefix=prefix)


def read_identity(path: str | None, where: str = "nats_credentials") -> NatsIdentity:
    """The identity in the credentials file at `path` (none: anonymous), read now;
    CredentialsError names `where` when it cannot be read or is not a credentials file."""
    if not path:
        return NatsIdentity()
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        raise CredentialsError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    return identity_of(text, path, where)


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
    one that is not a `nats://host:port` URL (its credentials redacted: the message is
    printed and logged)."""
    servers = [part.strip() for part in value.split(",")]
    if not any(servers):
        raise ValueError("no NATS server URL given")
    for url in servers:
        if not _URL.match(url):
            raise ValueError(f"{redact(url)!r} is not a nats://host:port URL")
        parts = urlsplit(url)
        try:
            port = parts.port  # urllib refuses a port that is not 0..65535
        except ValueError:
            raise ValueError(f"{redact(url)!r} has no valid port") from None
        if not parts.hostname or port == 0:
            raise ValueError(f"{redact(url)!r} needs a host and a port other than 0")
    return servers


class ServerUrl(Protocol):
    """A parsed server URL (urllib's, as nats-py and `procs.natsproto` keep theirs)."""

    @property
    def hostname(self) -> str | None: ...

    @property
    def port(self) -> int | None: ...


def host_port(url: ServerUrl | None) -> str:
    """`host:port` of a server URL ("" when none): how a process names the NATS server it
    is on, never with the URL's credentials (`procs.redact` for a URL as given)."""
    if url is None or not url.hostname:
        return ""
    return f"{url.hostname}:{url.port}"


def _readable(value: str | None) -> None:
    if value is not None and not Path(value).is_file():
        raise ValueError(f"{value} does not exist")


def _credentials(value: str | None) -> None:
    """A credentials file is read at start, so that a bad one is a bad setting."""
    if value is not None:
        read_identity(value, value)


def _subject_prefix(value: str) -> None:
    Subjects(value)


class NatsSettings(SettingsGroup, frozen=True):
    """How a gpufleet process reaches NATS, the same in every process: nested as `nats`
    in its settings model; outside it flat (`--nats-url`, `GPUFLEET_NATS_URL`, a file's
    `nats_url = …` or `[nats]` table)."""

    url: Annotated[
        str,
        Meta(
            description=(
                "NATS server URL; a comma-separated list of seeds (any one live seed is enough to "
                "start; the rest of the cluster is learnt from it); a `user:password@` in it is "
                "never logged (`nats_credentials` keeps it out of the settings too)"
            )
        ),
        Option(check=split_servers),
    ] = DEFAULT_NATS_URL
    credentials: Annotated[
        str | None,
        Meta(
            description=(
                "NATS credentials file (`.creds`, or the TOML `gpufleet nats-auth` writes)"
            )
        ),
        Option(deprecated=("nats_creds",), check=_credentials),
    ] = None
    tls_ca: Annotated[
        str | None,
        Meta(description="CA bundle (PEM) that NATS servers' certificates must chain to"),
        Option(check=_readable),
    ] = None
    tls_cert: Annotated[
        str | None,
        Meta(description="client certificate (PEM) for NATS servers that verify clients"),
        Option(check=_readable),
    ] = None
    tls_key: Annotated[
        str | None,
        Meta(description="private key (PEM) of `nats_tls_cert`"),
        Option(check=_readable),
    ] = None
    subject_prefix: Annotated[
        str,
        Meta(description="NATS subject prefix"),
        Option(outer="subject_prefix", check=_subject_prefix),
    ] = DEFAULT_PREFIX

    def check(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("nats_tls_key", "nats_tls_cert and nats_tls_key go together")

    @property
    def servers(self) -> list[str]:
        """The seeds of `url`, in the order given (ValueError when one is not a URL)."""
        return split_servers(self.url)

    def client_options(self) -> dict[str, Any]:
        """nats-py's connect options for these settings: credentials (read now) and TLS;
        CredentialsError names `nats_credentials`."""
        options = read_identity(self.credentials).nats_py()
        tls = tls_context(self.tls_ca, self.tls_cert, self.tls_key)
        if tls is not None:
            options["tls"] = tls
        return options


class ProbedNatsSettings(NatsSettings, frozen=True):
    """NATS settings of a process that probes its link (`procs.nats_link`): the
    coordinator, the alert forwarder and the Slurm bridge."""

    probe_interval_s: Annotated[
        float, Meta(gt=0, le=60, description="seconds between NATS round-trip probes")
    ] = DEFAULT_PROBE_INTERVAL_S
    probe_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=60,
            description=(
                "seconds without an answer to a probe before the NATS link is taken as dead"
            ),
        ),
    ] = DEFAULT_PROBE_TIMEOUT_S
