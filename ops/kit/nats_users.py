"""NATS users and their permissions for a fleet, and their passwords.

Each agent gets its own user, allowed to publish only its own heartbeat and inventory
subjects and to subscribe only to its own inventory-request subject and to its own
node's bookings (in any pool, so a node moved between pools still hears them; another
node's bookings name other tenants' reservations), so a compromised host cannot speak
for another nor read what others hold. The coordinator may read every heartbeat and inventory,
ask for inventories, publish and read alerts (its console feed) and use JetStream.
Optional reader users (monitoring) may read alerts, live on core NATS or from the
JetStream stream by direct get, and nothing else: no consumer at all, so none can
rewrite, take over or pre-create a forwarder's, nor push the stream onto an agent's
subjects. Each alert forwarder (the Slurm bridge is one) gets its own user, which may
create, update and read the one consumer named after it and nothing else. Readers and
forwarders each get replies only under an inbox prefix of their own (written into their
credentials file), never `_INBOX.>`.

Passwords are random (192 bits) and reach nats-server only as bcrypt hashes. Because
they are random, not chosen by people, a low bcrypt cost loses nothing against guessing
and keeps reconnect storms cheap: the server checks a hash on every connect.

Pure: names in, users out.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ops.kit.errors import OpsError
from shared.ids import NODE_ID_PATTERN, POOL_ID_PATTERN
from shared.subjects import Subjects

COORDINATOR_USER = "coordinator"
DEFAULT_BCRYPT_COST = 6
_READER_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# A consumer name is one subject token in the JetStream API: no dots or wildcards.
_DURABLE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# `gpufleet-alerts`' consumer unless its --durable says otherwise.
DEFAULT_FORWARDER_DURABLE = "alert-forwarder"

Role = Literal["coordinator", "agent", "reader", "forwarder"]


class NatsAuthError(OpsError, ValueError):
    """Bad input to the generator, or a credentials file that cannot be read (exit 2)."""

    exit_code = 2
    prog = "gpufleet nats-auth"


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
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    # Carved out of `publish` (nats-server applies deny over allow).
    publish_deny: tuple[str, ...] = ()
    # Lets an agent answer a request on its reply subject without a publish grant on
    # anyone's inbox.
    allow_responses: bool = False
    # Its replies' subject prefix (nats-py `inbox_prefix`), when not the shared `_INBOX`.
    inbox_prefix: str | None = None


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
            subjects.use(node.pool_id, node.node_id),
        ),
        subscribe=(
            subjects.inventory_request(node.pool_id, node.node_id),
            subjects.use_request(node.pool_id, node.node_id),
            subjects.bookings("*", node.node_id),
        ),
        allow_responses=True,
    )


def coordinator_permissions(subjects: Subjects) -> Permissions:
    p = subjects.prefix
    return Permissions(
        publish=(
            f"{p}.invreq.>",
            f"{p}.usereq.>",
            f"{p}.bookings.>",
            f"{p}.alert.>",
            "$JS.API.>",
        ),
        # Alerts: every replica's console feed listens to all of them, its own included.
        # JetStream API answers, and agents' inventory replies, arrive on its _INBOX.
        # Use reports (SPEC §10) arrive on `use`; it asks for them on `usereq`.
        subscribe=(f"{p}.hb.>", f"{p}.inv.>", f"{p}.use.>", f"{p}.alert.>", "_INBOX.>"),
    )


def inbox_prefix(user: str) -> str:
    """The subject prefix of a user's reply inboxes (nats-py's `inbox_prefix`), written
    into its credentials file: one token of its own, so no user may read another's
    replies. Dots (in reader names) are escaped as in node subjects, so reader `a`'s
    prefix never covers reader `a.b`'s."""
    return "_INBOX_" + user.replace("%", "%25").replace(".", "%2E")


def reader_permissions(subjects: Subjects, alert_stream: str, user: str) -> Permissions:
    """Live alerts on core NATS, and the alert stream's history by direct get (batched),
    and nothing else: no consumer of any kind, so a reader can neither create, update
    nor read anyone's consumer, nor point a push consumer at another user's subjects.
    Replies reach it only under its own inbox prefix."""
    s = alert_stream
    return Permissions(
        publish=(
            "$JS.API.INFO",
            f"$JS.API.STREAM.INFO.{s}",
            f"$JS.API.STREAM.MSG.GET.{s}",
            f"$JS.API.DIRECT.GET.{s}",
            f"$JS.API.DIRECT.GET.{s}.>",
        ),
        subscribe=(subjects.all_alerts, f"{inbox_prefix(user)}.>"),
        inbox_prefix=inbox_prefix(user),
    )


def forwarder_permissions(alert_stream: str, durable: str, user: str) -> Permissions:
    """Its own durable consumer on the alert stream and no other: create or update it
    (`$JS.API.CONSUMER.CREATE.<stream>.<durable>[.<filter>]`, the only create subjects
    that name the consumer in the subject, so the server refuses any other name), read
    its info, pull and acknowledge. The stream's history, read at start to rebuild which
    conditions fire, comes by direct get, as a reader's. It may not delete a consumer
    nor touch the stream, and it publishes nothing else; replies reach it only under its
    own inbox prefix."""
    s, d = alert_stream, durable
    return Permissions(
        publish=(
            "$JS.API.INFO",
            f"$JS.API.STREAM.INFO.{s}",
            f"$JS.API.STREAM.MSG.GET.{s}",
            f"$JS.API.DIRECT.GET.{s}",
            f"$JS.API.CONSUMER.CREATE.{s}.{d}",
            f"$JS.API.CONSUMER.CREATE.{s}.{d}.>",
            f"$JS.API.CONSUMER.INFO.{s}.{d}",
            f"$JS.API.CONSUMER.MSG.NEXT.{s}.{d}",
            f"$JS.ACK.{s}.{d}.>",
        ),
        subscribe=(f"{inbox_prefix(user)}.>",),
        inbox_prefix=inbox_prefix(user),
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
