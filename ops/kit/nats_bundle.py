"""A fleet's NATS auth bundle: every user with its password and permissions, and the
server configs that include them (`build`, pure: nodes in, text out), written to a
directory with owner-only files (`write_bundle`). `gpufleet nats-auth` and the demo
make one."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ops.kit.nats_server_config import (
    AUTHORIZATION_FILE,
    DEFAULT_LISTEN,
    SERVER_CONFIG,
    ClusterServer,
    TlsFiles,
    credentials_text,
    render_authorization,
    render_cluster_configs,
    render_server_config,
)
from ops.kit.nats_users import (
    COORDINATOR_USER,
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

# The Ansible variable `passwords.json` sets (the roles read it).
ANSIBLE_PASSWORDS_VAR = "gpufleet_nats_passwords"


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
        found = next(u for u in self.users if u.name == user)
        return credentials_text(user, self.passwords[user], found.permissions.inbox_prefix)


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
    for name in sorted(set(readers)):
        reader = reader_user(name)
        perms = reader_permissions(subjects, alert_stream, reader)
        users.append(NatsUser(reader, "reader", perms))
    for durable in sorted(set(forwarders)):
        forwarder = forwarder_user(durable)
        perms = forwarder_permissions(alert_stream, durable, forwarder)
        users.append(NatsUser(forwarder, "forwarder", perms))
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
