"""`gpufleet nats-auth`: a fleet's NATS users (`ops.kit.nats_users`) and server configs
(`ops.kit.nats_server_config`) built from its nodes, and written to a directory with the
passwords kept from the previous run (`passwords.json`, the Ansible variable) and one
credentials file per user.

Everything above the "files" section is pure: nodes in, text out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ops.kit.nats_bundle import ANSIBLE_PASSWORDS_VAR, build, write_bundle
from ops.kit.nats_server_config import (
    AUTHORIZATION_FILE,
    DEFAULT_LISTEN,
    TlsFiles,
    parse_server_arg,
)
from ops.kit.nats_users import (
    DEFAULT_BCRYPT_COST,
    DEFAULT_FORWARDER_DURABLE,
    AgentNode,
    NatsAuthError,
    bcrypt_hasher,
)
from shared.streams import stream_name
from shared.subjects import DEFAULT_PREFIX

ANSIBLE_AGENT_GROUP = "gpufleet_agents"


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
    generate(NatsAuthArgs(**flags))


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


def generate(args: NatsAuthArgs) -> None:
    """Write the bundle; NatsAuthError (exit 2) when the input is wrong."""
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
    except NatsAuthError:
        raise
    except (ValueError, OSError) as exc:
        raise NatsAuthError(str(exc)) from None
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
