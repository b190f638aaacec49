"""`gpufleet nats-auth`: a fleet's NATS users (`ops.nats_users`) and server configs
(`ops.nats_server_config`) built from its nodes, and written to a directory with the
passwords kept from the previous run (`passwords.json`, the Ansible variable) and one
credentials file per user.

Everything above the "files" section is pure: nodes in, text out.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ops.nats_server_config import (
    AUTHORIZATION_FILE,
    DEFAULT_LISTEN,
    SERVER_CONFIG,
    ClusterServer,
    TlsFiles,
    credentials_text,
    parse_server_arg,
    render_authorization,
    render_cluster_configs,
    render_server_config,
)
from ops.nats_users import (
    COORDINATOR_USER,
    DEFAULT_BCRYPT_COST,
    DEFAULT_FORWARDER_DURABLE,
    AgentNode,
    NatsAuthError,
    NatsUser,
    agent_permissions,
    agent_user,
    bcrypt_hasher,
    coordinator_permissions,
    forwarder_permissions,
    forwarder_user,
    new_password,
    reader_permissions,
    reader_user,
)
from shared.subjects import DEFAULT_PREFIX, Subjects

ANSIBLE_PASSWORDS_VAR = "gpufleet_nats_passwords"
ANSIBLE_AGENT_GROUP = "gpufleet_agents"


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
