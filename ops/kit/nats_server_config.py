"""The files nats-server and the clients read, as text: the users' `authorization`
block, a single server's config or one per server of a JetStream cluster, and a
credentials file (`user = "…"` / `password = "…"`, TOML; `procs/nats.py` reads
it, for the agent's publisher and the coordinator's bus alike, and accepts a NATS JWT
`.creds` file in its place).

The server config listens on loopback by default. Anything else must be TLS: passwords
and heartbeats would otherwise cross the network in clear, so `render_server_config`
refuses a non-loopback `listen` without a certificate and key (`TlsFiles`).

For a cluster (`--cluster NAME --server NAME=CLIENT,ROUTE ...`) it writes one config per
server instead: its name, client listener, JetStream store, and routes to the others.
Routes carry no password, so a route listener off loopback needs TLS with a CA, and the
servers then verify each other's certificates: anyone else who reached the route port
would join the cluster and see every message.

Pure: users in, text out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ops.kit.nats_users import NatsAuthError, NatsUser

# Server and cluster names: a file name part and a config string, nothing that needs care.
_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_LISTEN = "127.0.0.1:4222"
SERVER_CONFIG = "nats-server.conf"
AUTHORIZATION_FILE = "authorization.conf"


@dataclass(frozen=True)
class TlsFiles:
    """Paths on the NATS host: its certificate and key, and optionally a CA that client
    certificates must be signed by (`verify`)."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    verify: bool = False


def is_loopback(listen: str) -> bool:
    """Whether a `host:port` (or `[v6]:port`, or a bare host) is this host only."""
    host = listen.strip()
    if host.startswith("[") and "]" in host:
        host = host[1 : host.index("]")]
    elif host.count(":") == 1:
        host = host.split(":")[0]
    return host in ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ClusterServer:
    """One server of a cluster: its name, where clients connect, where routes connect."""

    name: str
    listen: str
    cluster_listen: str

    def __post_init__(self) -> None:
        if not _SERVER_NAME.match(self.name):
            raise NatsAuthError(f"server name {self.name!r}: use 1-64 of [A-Za-z0-9._-]")

    @property
    def config_filename(self) -> str:
        return f"nats-server-{self.name}.conf"


def parse_server_arg(text: str) -> ClusterServer:
    """`SERVER_NAME=CLIENT_HOST:PORT,CLUSTER_HOST:PORT`"""
    name, sep, addresses = text.partition("=")
    listen, comma, cluster_listen = addresses.partition(",")
    if not (sep and comma and _has_port(listen) and _has_port(cluster_listen)):
        raise NatsAuthError(f"{text!r} is not SERVER_NAME=CLIENT_HOST:PORT,CLUSTER_HOST:PORT")
    return ClusterServer(name, listen.strip(), cluster_listen.strip())


def _has_port(address: str) -> bool:
    host, sep, port = address.strip().rpartition(":")
    return bool(host and sep and port.isdigit() and 0 < int(port) < 65536)


def _quote(value: str) -> str:
    # JSON strings are valid NATS config strings, and quoting keeps '$' in bcrypt hashes
    # and JetStream subjects from being read as variable references.
    return json.dumps(value)


def _list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_quote(v) for v in values) + "]"


def render_authorization(users: Sequence[NatsUser], hashes: Mapping[str, str]) -> str:
    """The `authorization { users: [...] }` block: what a server config of your own can
    `include` (the path is relative to the including file)."""
    lines = [
        "# gpufleet NATS users, written by `gpufleet nats-auth`: regenerate, do not edit.",
        "# Passwords are bcrypt hashes; the clear ones are in passwords.json and creds/",
        "# beside this file (keep those secret). Apply with `nats-server --signal reload`:",
        "# clients whose password did not change stay connected.",
        "authorization {",
        "  users: [",
    ]
    for user in users:
        perms = user.permissions
        deny = f", deny: {_list(perms.publish_deny)}" if perms.publish_deny else ""
        lines += [
            "    {",
            f"      user: {_quote(user.name)}",
            f"      password: {_quote(hashes[user.name])}",
            "      permissions: {",
            f"        publish: {{ allow: {_list(perms.publish)}{deny} }}",
            f"        subscribe: {{ allow: {_list(perms.subscribe)} }}",
        ]
        if perms.allow_responses:
            lines.append("        allow_responses: true")
        lines += ["      }", "    }"]
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def _require_tls(listen: str, tls: TlsFiles | None) -> None:
    if tls is None and not is_loopback(listen):
        raise NatsAuthError(
            f"listening on {listen} without TLS would send passwords in clear: give"
            " --tls-cert and --tls-key, or listen on 127.0.0.1"
        )


def _tls_block(tls: TlsFiles, *, verify: bool, indent: str = "") -> list[str]:
    return [
        f"{indent}tls {{",
        f"{indent}  cert_file: {_quote(tls.cert_file)}",
        f"{indent}  key_file: {_quote(tls.key_file)}",
        *([f"{indent}  ca_file: {_quote(tls.ca_file)}"] if tls.ca_file else []),
        *([f"{indent}  verify: true"] if verify else []),
        f"{indent}  timeout: 2",
        f"{indent}}}",
    ]


def _jetstream_block(store_dir: str | None) -> list[str]:
    if store_dir is None:
        return ["jetstream: enabled"]
    return ["jetstream {", f"  store_dir: {_quote(store_dir)}", "}"]


def render_server_config(
    *,
    listen: str = DEFAULT_LISTEN,
    store_dir: str | None = "/var/lib/nats/jetstream",
    tls: TlsFiles | None = None,
) -> str:
    """A whole single-server config around the users file. `store_dir=None` leaves the
    JetStream store to the command line (`-sd`, as the embedded test server passes it).
    Clusters: `render_cluster_configs`."""
    _require_tls(listen, tls)
    tls_block = _tls_block(tls, verify=tls.verify) if tls is not None else []
    return "\n".join(
        [
            "# nats-server configuration for gpufleet, written by `gpufleet nats-auth`.",
            f"listen: {_quote(listen)}",
            *tls_block,
            *_jetstream_block(store_dir),
            f"include {_quote(AUTHORIZATION_FILE)}",
            "",
        ]
    )


def render_cluster_configs(
    cluster: str,
    servers: Sequence[ClusterServer],
    *,
    store_dir: str | None = "/var/lib/nats/jetstream",
    tls: TlsFiles | None = None,
) -> dict[str, str]:
    """One config per server of a JetStream cluster, by file name: each server routes to
    all the others and keeps its store in `<store_dir>/<server name>` (so the files
    also serve several servers on one host). Clients' listeners follow the single
    server's rule; a route listener off loopback needs TLS and a CA, and then the
    servers verify each other (routes have no password)."""
    if not _SERVER_NAME.match(cluster):
        raise NatsAuthError(f"cluster name {cluster!r}: use 1-64 of [A-Za-z0-9._-]")
    for what, values in (
        ("server name", [s.name for s in servers]),
        ("address", [a for s in servers for a in (s.listen, s.cluster_listen)]),
    ):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise NatsAuthError(f"{what} {twice[0]!r} is given twice")
    configs = {}
    for server in servers:
        _require_tls(server.listen, tls)
        if not is_loopback(server.cluster_listen) and (tls is None or tls.ca_file is None):
            raise NatsAuthError(
                f"server {server.name}: routes on {server.cluster_listen} carry no password;"
                " give --tls-cert, --tls-key and --tls-ca (the servers then verify each"
                " other), or listen on 127.0.0.1"
            )
        routes = [f"nats-route://{o.cluster_listen}" for o in servers if o is not server]
        route_tls = []
        if tls is not None:
            route_tls = _tls_block(tls, verify=tls.ca_file is not None, indent="  ")
        store = None if store_dir is None else str(PurePosixPath(store_dir) / server.name)
        configs[server.config_filename] = "\n".join(
            [
                f"# nats-server configuration for gpufleet: server {server.name} of cluster"
                f" {cluster}, written by `gpufleet nats-auth`.",
                f"server_name: {_quote(server.name)}",
                f"listen: {_quote(server.listen)}",
                *(_tls_block(tls, verify=tls.verify) if tls is not None else []),
                *_jetstream_block(store),
                "cluster {",
                f"  name: {_quote(cluster)}",
                f"  listen: {_quote(server.cluster_listen)}",
                *route_tls,
                f"  routes: {_list(routes)}",
                "}",
                f"include {_quote(AUTHORIZATION_FILE)}",
                "",
            ]
        )
    return configs


def credentials_text(user: str, password: str, inbox_prefix: str | None = None) -> str:
    """The TOML `procs.nats.read_identity` reads; `inbox_prefix`: where the user's
    replies must arrive (its permissions allow no other inbox)."""
    text = (
        "# NATS credentials for gpufleet (written by `gpufleet nats-auth`); keep secret.\n"
        f"user = {_quote(user)}\n"
        f"password = {_quote(password)}\n"
    )
    if inbox_prefix is not None:
        text += f"inbox_prefix = {_quote(inbox_prefix)}\n"
    return text
