"""NATS users and their permissions for a fleet, and their passwords.

Each agent gets its own user, allowed to publish only its own heartbeat and inventory
subjects and to subscribe only to its own inventory-request subject and to its own
node's bookings (in any pool, so a node moved between pools still hears them; another
node's bookings name other tenants' reservations), so a compromised host cannot speak
for another nor read what others hold. The coordinator may read every heartbeat and inventory,
ask for inventories, publish and read alerts (its console feed) and use JetStream.
Optional reader users (monitoring) may read alerts, live or from the JetStream stream
through ephemeral consumers, and nothing else: they can neither create nor delete a
durable consumer, nor pull or acknowledge the forwarders' ones. Each alert forwarder
gets its own user, which may create, read and recreate its own durable consumer and
nothing else.

Passwords are random (192 bits) and reach nats-server only as bcrypt hashes. Because
they are random, not chosen by people, a low bcrypt cost loses nothing against guessing
and keeps reconnect storms cheap: the server checks a hash on every connect.

Pure: names in, users out.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Collection
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
