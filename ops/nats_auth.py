"""NATS users and permissions for a fleet: the nats-server configuration, the credentials
files the agents and the coordinator connect with, and `gpufleet nats-auth`.

Each agent gets its own user, allowed to publish only its own heartbeat and inventory
subjects and to subscribe only to its own inventory-request subject, so a compromised
host cannot speak for another. The coordinator may read every heartbeat and inventory,
ask for inventories, publish and read alerts (its console feed) and use JetStream.
Optional reader users (monitoring) may read alerts, live or from the JetStream stream
through ephemeral consumers, and nothing else: they can neither create nor delete a
durable consumer, nor pull or acknowledge the forwarders' ones. Each alert forwarder
gets its own user, which may create, read and recreate its own durable consumer and
nothing else.

Passwords are random (192 bits) and reach nats-server only as bcrypt hashes. Because
they are random, not chosen by people, a low bcrypt cost loses nothing against guessing
and keeps reconnect storms cheap: the server checks a hash on every connect.

This module writes the credentials files (`user = "…"` / `password = "…"`, TOML);
`shared/credentials.py` reads them, for the agent's publisher and the coordinator's bus
alike. A NATS JWT `.creds` file (decentralised auth, `nsc`) is accepted by both in its
place.

The server config listens on loopback by default. Anything else must be TLS: passwords
and heartbeats would otherwise cross the network in clear, so `render_server_config`
refuses a non-loopback `listen` without a certificate and key (`TlsFiles`).

For a cluster (`--cluster NAME --server NAME=CLIENT,ROUTE ...`) it writes one config per
server instead: its name, client listener, JetStream store, and routes to the others.
Routes carry no password, so a route listener off loopback needs TLS with a CA, and the
servers then verify each other's certificates: anyone else who reached the route port
would join the cluster and see every message.

Everything above the "files" section is pure: nodes in, text out.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import click

from shared.ids import NODE_ID_PATTERN, POOL_ID_PATTERN
from shared.subjects import DEFAULT_PREFIX, Subjects

COORDINATOR_USER = "coordinator"
DEFAULT_BCRYPT_COST = 6
ANSIBLE_PASSWORDS_VAR = "gpufleet_nats_passwords"
ANSIBLE_AGENT_GROUP = "gpufleet_agents"
_READER_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# Server and cluster names: a file name part and a config string, nothing that needs care.
_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A consumer name is one subject token in the JetStream API: no dots or wildcards.
_DURABLE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# `gpufleet-alerts`' consumer unless its --durable says otherwise.
DEFAULT_FORWARDER_DURABLE = "alert-forwarder"

Role = Literal["coordinator", "agent", "reader", "forwarder"]
DEFAULT_LISTEN = "127.0.0.1:4222"
SERVER_CONFIG = "nats-server.conf"


class NatsAuthError(ValueError):
    """Bad input to the generator, or a credentials file that cannot be read."""


@dataclass(frozen=True, order=True)
class AgentNode:
    pool_id: str
    node_id: str

    def __post_init__(self) -> None:
        if not re.match(POOL_ID_PATTERN, self.pool_id):
            raise NatsAuthError(f"node {self.node_id!r}: pool id {self.pool_id!r} is invalid")
        if not re.match(NODE_ID_PATTERN, self.node_id):
            raise NatsAuthError(f"node id {self.node_id!r} does not match {NODE_ID_PATTERN}")


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


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    # Carved out of `publish` (nats-server applies deny over allow).
    publish_deny: tuple[str, ...] = ()
    # Lets an agent answer a request on its reply subject without a publish grant on
    # anyone's inbox.
    allow_responses: bool = False


@dataclass(frozen=True)
class NatsUser:
    name: str
    role: Role
    permissions: Permissions
    node: AgentNode | None = None

    @property
    def creds_filename(self) -> str:
        # ':' never occurs in pool or node ids, and pool ids have no '-', so this is
        # one-to-one.
        return self.name.replace(":", "-") + ".creds"


@dataclass(frozen=True)
class AuthBundle:
    users: tuple[NatsUser, ...]
    passwords: Mapping[str, str]
    authorization: str  # the users, for AUTHORIZATION_FILE
    # Whole server configs that include it, by file name: SERVER_CONFIG, or one per
    # server of a cluster.
    server_configs: Mapping[str, str]
    # Users whose password is new in this bundle (new users and rotated ones).
    changed: frozenset[str] = frozenset()

    @property
    def server_config(self) -> str:
        """The single server's config (not written for a cluster)."""
        return self.server_configs[SERVER_CONFIG]

    def credentials(self, user: str) -> str:
        return credentials_text(user, self.passwords[user])


def agent_user(node: AgentNode) -> str:
    return f"agent:{node.pool_id}:{node.node_id}"


def reader_user(name: str) -> str:
    if not _READER_NAME.match(name):
        raise NatsAuthError(f"reader name {name!r}: use 1-64 of [A-Za-z0-9._-]")
    return f"reader:{name}"


def forwarder_user(durable: str) -> str:
    if not _DURABLE_NAME.match(durable):
        raise NatsAuthError(f"forwarder durable {durable!r}: use 1-64 of [A-Za-z0-9_-]")
    return f"forwarder:{durable}"


def agent_permissions(subjects: Subjects, node: AgentNode) -> Permissions:
    return Permissions(
        publish=(
            subjects.heartbeat(node.pool_id, node.node_id),
            subjects.inventory(node.pool_id, node.node_id),
        ),
        subscribe=(subjects.inventory_request(node.pool_id, node.node_id),),
        allow_responses=True,
    )


def coordinator_permissions(subjects: Subjects) -> Permissions:
    p = subjects.prefix
    return Permissions(
        publish=(f"{p}.invreq.>", f"{p}.alert.>", "$JS.API.>"),
        # Alerts: every replica's console feed listens to all of them, its own included.
        # JetStream API answers, and agents' inventory replies, arrive on its _INBOX.
        subscribe=(f"{p}.hb.>", f"{p}.inv.>", f"{p}.alert.>", "_INBOX.>"),
    )


def reader_permissions(
    subjects: Subjects,
    alert_stream: str,
    protected: Collection[str] = (DEFAULT_FORWARDER_DURABLE,),
) -> Permissions:
    """Live alerts on core NATS, and the alert stream through ephemeral consumers (push or
    pull), but no stream management, no publishing, and no durable consumers.

    Only the legacy create subject `$JS.API.CONSUMER.CREATE.<stream>` is granted:
    nats-server refuses a durable there (the consumer is named by the server), whereas
    `…CREATE.<stream>.<name>` makes a durable whenever the body names one. So a reader
    creates its consumer unnamed (nats-py: `subscribe`, or `add_consumer` without a name
    then `pull_subscribe_bind`). Delete is not granted at all; an ephemeral consumer goes
    away by itself once idle. Consumer names are not known in advance, so `protected`
    durables (the forwarders') are denied by name: a reader pulling or acknowledging on
    one would take alerts away from it."""
    s = alert_stream
    return Permissions(
        publish=(
            "$JS.API.INFO",
            "$JS.API.STREAM.NAMES",
            f"$JS.API.STREAM.INFO.{s}",
            f"$JS.API.STREAM.MSG.GET.{s}",
            f"$JS.API.DIRECT.GET.{s}",
            f"$JS.API.DIRECT.GET.{s}.>",
            f"$JS.API.CONSUMER.CREATE.{s}",
            f"$JS.API.CONSUMER.INFO.{s}.*",
            f"$JS.API.CONSUMER.MSG.NEXT.{s}.*",
            f"$JS.API.CONSUMER.NAMES.{s}",
            f"$JS.API.CONSUMER.LIST.{s}",
            f"$JS.ACK.{s}.>",
            f"$JS.FC.{s}.>",
        ),
        subscribe=(subjects.all_alerts, "_INBOX.>"),
        publish_deny=tuple(
            subject
            for durable in sorted(set(protected))
            for subject in (f"$JS.API.CONSUMER.MSG.NEXT.{s}.{durable}", f"$JS.ACK.{s}.{durable}.>")
        ),
    )


def forwarder_permissions(
    alert_stream: str, durable: str, protected: Collection[str] = ()
) -> Permissions:
    """Its own durable consumer on the alert stream, by any of the three create subjects
    nats-py uses (each names the consumer, so it can be no other): create it, recreate it
    when someone deleted it, read its info, pull and acknowledge. At start it reads the
    stream's history through an unnamed (ephemeral, unacknowledged) consumer, as a reader
    may, to rebuild which conditions fire; the other `protected` durables are denied by
    name, so it can take no other forwarder's alerts. It may not delete any consumer nor
    touch the stream, and it publishes nothing else."""
    s, d = alert_stream, durable
    return Permissions(
        publish=(
            "$JS.API.INFO",
            f"$JS.API.STREAM.INFO.{s}",
            f"$JS.API.CONSUMER.CREATE.{s}",
            f"$JS.API.CONSUMER.CREATE.{s}.{d}",
            f"$JS.API.CONSUMER.CREATE.{s}.{d}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{s}.{d}",
            f"$JS.API.CONSUMER.INFO.{s}.{d}",
            f"$JS.API.CONSUMER.MSG.NEXT.{s}.*",
            f"$JS.ACK.{s}.{d}.>",
        ),
        subscribe=("_INBOX.>",),
        publish_deny=tuple(
            f"$JS.API.CONSUMER.MSG.NEXT.{s}.{other}" for other in sorted(set(protected) - {d})
        ),
    )


def new_password() -> str:
    return secrets.token_urlsafe(24)


def bcrypt_hasher(cost: int = DEFAULT_BCRYPT_COST) -> Callable[[str], str]:
    import bcrypt  # the coordinator extra; only the generator needs it

    if not 4 <= cost <= 31:
        raise NatsAuthError("bcrypt cost must be between 4 and 31")

    def hash_password(password: str) -> str:
        return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)).decode()

    return hash_password


def build(
    nodes: Iterable[AgentNode],
    *,
    alert_stream: str,
    prefix: str = DEFAULT_PREFIX,
    readers: Iterable[str] = (),
    forwarders: Iterable[str] = (),
    passwords: Mapping[str, str] | None = None,
    rotate: Collection[str] = (),
    hash_password: Callable[[str], str] | None = None,
    make_password: Callable[[], str] = new_password,
    listen: str = DEFAULT_LISTEN,
    store_dir: str | None = "/var/lib/nats/jetstream",
    tls: TlsFiles | None = None,
    cluster: str | None = None,
    servers: Sequence[ClusterServer] = (),
) -> AuthBundle:
    """Every user of a fleet with its password and permissions, and the server config:
    one, or with `cluster` one per server of `servers` (`listen` then unused).

    Passwords in `passwords` (the previous run's) are kept, so regenerating after adding
    a node touches no other host; users named in `rotate` (or `"all"`) get new ones.
    Users not in the fleet any more are dropped, which revokes them.
    """
    subjects = Subjects(prefix)
    hasher = hash_password or bcrypt_hasher()
    users = [NatsUser(COORDINATOR_USER, "coordinator", coordinator_permissions(subjects))]
    seen: set[str] = set()
    for node in sorted(set(nodes)):
        if node.node_id in seen:
            raise NatsAuthError(f"node id {node.node_id!r} is listed in more than one pool")
        seen.add(node.node_id)
        users.append(NatsUser(agent_user(node), "agent", agent_permissions(subjects, node), node))
    durables = sorted(set(forwarders))
    protected = {DEFAULT_FORWARDER_DURABLE, *durables}
    for name in sorted(set(readers)):
        perms = reader_permissions(subjects, alert_stream, protected)
        users.append(NatsUser(reader_user(name), "reader", perms))
    for durable in durables:
        perms = forwarder_permissions(alert_stream, durable, protected)
        users.append(NatsUser(forwarder_user(durable), "forwarder", perms))
    names = {u.name for u in users}
    unknown = set(rotate) - names - {"all"}
    if unknown:
        raise NatsAuthError(f"cannot rotate {sorted(unknown)[0]!r}: no such user")
    previous = passwords or {}
    out: dict[str, str] = {}
    changed: set[str] = set()
    for user in users:
        keep = previous.get(user.name)
        if keep and user.name not in rotate and "all" not in rotate:
            out[user.name] = keep
        else:
            out[user.name] = make_password()
            changed.add(user.name)
    authorization = render_authorization(users, {u.name: hasher(out[u.name]) for u in users})
    if cluster is None and not servers:
        configs = {SERVER_CONFIG: render_server_config(listen=listen, store_dir=store_dir, tls=tls)}
    elif cluster is None or not servers:
        raise NatsAuthError("--cluster and --server go together")
    else:
        configs = render_cluster_configs(cluster, servers, store_dir=store_dir, tls=tls)
    return AuthBundle(tuple(users), out, authorization, configs, frozenset(changed))


def _quote(value: str) -> str:
    # JSON strings are valid NATS config strings, and quoting keeps '$' in bcrypt hashes
    # and JetStream subjects from being read as variable references.
    return json.dumps(value)


def _list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_quote(v) for v in values) + "]"


AUTHORIZATION_FILE = "authorization.conf"


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


def credentials_text(user: str, password: str) -> str:
    return (
        "# NATS credentials for gpufleet (written by `gpufleet nats-auth`); keep secret.\n"
        f"user = {_quote(user)}\n"
        f"password = {_quote(password)}\n"
    )


def nodes_from_json(data: Any, group: str = ANSIBLE_AGENT_GROUP) -> list[AgentNode]:
    """Nodes from `[{"poolId": …, "nodeId": …}]` (or `{"nodes": [...]}`), or from
    `ansible-inventory --list` output: the hosts of `group`, with `gpufleet_agent_pool_id`
    and `gpufleet_agent_node_id` (default: the inventory host name) from their vars."""
    if isinstance(data, dict) and "_meta" in data:
        hostvars = data["_meta"].get("hostvars", {})
        hosts = _group_hosts(data, group)
        out = []
        for host in hosts:
            hv = hostvars.get(host, {})
            pool = hv.get("gpufleet_agent_pool_id")
            if not isinstance(pool, str):
                raise NatsAuthError(f"host {host}: gpufleet_agent_pool_id is not set")
            out.append(AgentNode(pool, str(hv.get("gpufleet_agent_node_id") or host)))
        return out
    items = data.get("nodes") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise NatsAuthError('expected a list of {"poolId", "nodeId"} or ansible-inventory JSON')
    out = []
    for item in items:
        if not isinstance(item, dict) or not {"poolId", "nodeId"} <= set(item):
            raise NatsAuthError(f"{item!r}: expected poolId and nodeId")
        out.append(AgentNode(str(item["poolId"]), str(item["nodeId"])))
    return out


def _group_hosts(inventory: Mapping[str, Any], group: str) -> list[str]:
    """Hosts of a group in `ansible-inventory --list` output, children included."""
    if group not in inventory:
        raise NatsAuthError(f"the inventory has no group {group!r}")
    hosts: list[str] = []
    stack, visited = [group], set()
    while stack:
        name = stack.pop()
        if name in visited:
            continue
        visited.add(name)
        entry = inventory.get(name, {})
        hosts += entry.get("hosts", [])
        stack += entry.get("children", [])
    return sorted(set(hosts))


def parse_node_arg(text: str) -> AgentNode:
    pool, sep, node = text.partition(":")
    if not sep:
        raise NatsAuthError(f"{text!r} is not POOL_ID:NODE_ID")
    return AgentNode(pool, node)


# -- files: `gpufleet nats-auth` ----------------------------------------------------------


def read_passwords(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise NatsAuthError(f"{path}: not JSON: {exc}") from None
    passwords = data.get(ANSIBLE_PASSWORDS_VAR) if isinstance(data, dict) else None
    if not isinstance(passwords, dict):
        raise NatsAuthError(f"{path}: expected {{{ANSIBLE_PASSWORDS_VAR!r}: {{user: password}}}}")
    return {str(k): str(v) for k, v in passwords.items()}


def _write_private(path: Path, text: str) -> None:
    """Write a secret atomically, readable by its owner only from the first byte."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_bundle(out_dir: Path, bundle: AuthBundle) -> None:
    """`authorization.conf` (the users), `nats-server.conf` or `nats-server-<name>.conf`
    per server of a cluster (each includes it), `passwords.json` (an Ansible vars file:
    the roles read `gpufleet_nats_passwords`) and `creds/<user>.creds`; stale creds and
    server configs (a cluster's old servers, or the other layout's) are removed."""
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    creds_dir = out_dir / "creds"
    creds_dir.mkdir(mode=0o700, exist_ok=True)
    _write_private(out_dir / AUTHORIZATION_FILE, bundle.authorization)
    for name, text in bundle.server_configs.items():
        _write_private(out_dir / name, text)
    for stale in out_dir.glob("nats-server*.conf"):
        if stale.name not in bundle.server_configs:
            stale.unlink()
    doc = {ANSIBLE_PASSWORDS_VAR: dict(sorted(bundle.passwords.items()))}
    _write_private(out_dir / "passwords.json", json.dumps(doc, indent=2) + "\n")
    wanted = set()
    for user in bundle.users:
        wanted.add(user.creds_filename)
        _write_private(creds_dir / user.creds_filename, bundle.credentials(user.name))
    for stale in creds_dir.glob("*.creds"):
        if stale.name not in wanted:
            stale.unlink()


@click.command(
    "nats-auth", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path),
    help="output directory (keep it secret)",
)
@click.option(
    "--nodes",
    multiple=True,
    type=click.Path(path_type=Path),
    metavar="FILE",
    help='JSON: [{"poolId", "nodeId"}] or `ansible-inventory --list` output (repeat)',
)
@click.option("--node", multiple=True, metavar="POOL_ID:NODE_ID", help="an agent (repeat)")
@click.option(
    "--group", default=ANSIBLE_AGENT_GROUP, show_default=True, help="agent group in the inventory"
)
@click.option("--reader", multiple=True, metavar="NAME", help="a read-only alerts user (repeat)")
@click.option(
    "--forwarder",
    multiple=True,
    metavar="DURABLE",
    help="an alert forwarder's user (forwarder:DURABLE), owning that durable consumer"
    f" (the forwarder's default: {DEFAULT_FORWARDER_DURABLE}; repeat)",
)
@click.option("--subject-prefix", default=DEFAULT_PREFIX, show_default=True)
@click.option(
    "--rotate", multiple=True, metavar="USER|all", help="new password for this user (repeat)"
)
@click.option("--bcrypt-cost", type=int, default=DEFAULT_BCRYPT_COST, show_default=True)
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    help="host:port nats-server listens on (a cluster's: --server); anything but"
    " loopback needs --tls-cert/key",
)
@click.option("--tls-cert", help="the server's certificate (path on the NATS host)")
@click.option("--tls-key", help="the server's private key (path on the NATS host)")
@click.option(
    "--tls-ca", help="CA for client certificates and a cluster's routes (path on the NATS host)"
)
@click.option("--tls-verify", is_flag=True, help="require client certificates from --tls-ca")
@click.option(
    "--store-dir",
    default="/var/lib/nats/jetstream",
    show_default=True,
    help="JetStream store (a cluster's servers: STORE_DIR/SERVER_NAME)",
)
@click.option(
    "--cluster",
    metavar="NAME",
    help="write a JetStream cluster's configs, nats-server-SERVER_NAME.conf, one per --server",
)
@click.option(
    "--server", multiple=True, metavar="SERVER_NAME=CLIENT_HOST:PORT,CLUSTER_HOST:PORT",
    help="a server of --cluster: where clients and where routes connect (repeat per server)",
)  # fmt: skip
def nats_auth_cmd(**flags: Any) -> None:
    """NATS server config and per-agent credentials for a fleet (offline). Exit 2 when
    the input is wrong."""
    code = generate(NatsAuthArgs(**flags))
    if code:
        raise SystemExit(code)


@dataclass(frozen=True)
class NatsAuthArgs:
    """The flags of `gpufleet nats-auth`."""

    out: Path
    nodes: tuple[Path, ...] = ()
    node: tuple[str, ...] = ()
    group: str = ANSIBLE_AGENT_GROUP
    reader: tuple[str, ...] = ()
    forwarder: tuple[str, ...] = ()
    subject_prefix: str = DEFAULT_PREFIX
    rotate: tuple[str, ...] = ()
    bcrypt_cost: int = DEFAULT_BCRYPT_COST
    listen: str = DEFAULT_LISTEN
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_verify: bool = False
    store_dir: str = "/var/lib/nats/jetstream"
    cluster: str | None = None
    server: tuple[str, ...] = ()


def generate(args: NatsAuthArgs) -> int:
    # Imported here: the bus imports this module (for the credentials format).
    from coordinator.bus.alerts import stream_name

    try:
        nodes = [parse_node_arg(n) for n in args.node]
        for path in args.nodes:
            nodes += nodes_from_json(json.loads(path.read_text()), args.group)
        tls = None
        if args.tls_cert or args.tls_key:
            if not (args.tls_cert and args.tls_key):
                raise NatsAuthError("--tls-cert and --tls-key go together")
            if args.tls_verify and not args.tls_ca:
                raise NatsAuthError("--tls-verify needs --tls-ca")
            tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_ca, args.tls_verify)
        previous = read_passwords(args.out / "passwords.json")
        bundle = build(
            nodes,
            alert_stream=stream_name(args.subject_prefix),
            prefix=args.subject_prefix,
            readers=args.reader,
            forwarders=args.forwarder,
            passwords=previous,
            rotate=args.rotate,
            hash_password=bcrypt_hasher(args.bcrypt_cost),
            listen=args.listen,
            store_dir=args.store_dir,
            tls=tls,
            cluster=args.cluster,
            servers=[parse_server_arg(server) for server in args.server],
        )
        write_bundle(args.out, bundle)
    except (NatsAuthError, ValueError, OSError) as exc:
        print(f"gpufleet nats-auth: {exc}", file=sys.stderr)
        return 2
    roles = [u.role for u in bundle.users]
    dropped = sorted(set(previous) - set(bundle.passwords))
    print(
        f"{roles.count('agent')} agents, {roles.count('reader')} readers,"
        f" {roles.count('forwarder')} forwarders, 1 coordinator"
    )
    print(f"new passwords: {', '.join(sorted(bundle.changed)) or 'none'}")
    if dropped:
        print(f"revoked: {', '.join(dropped)}")
    print(
        f"wrote {args.out}/: {AUTHORIZATION_FILE}, {', '.join(bundle.server_configs)},"
        " passwords.json, creds/"
    )
    print("apply with `nats-server --signal reload`; then push credentials (site.yml)")
    return 0
