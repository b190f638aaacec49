"""Tables of the ledger (SQLAlchemy Core). The Alembic revisions in `migrations/` create
them; each revision's edit is marked here with its number.

Times are integer milliseconds since the epoch, as on the API.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)

metadata = MetaData()

# r0004: a key the database generates and that grows for the ledger's whole life (events,
# bookings, claims, the outbox): 64-bit on PostgreSQL; on SQLite INTEGER, which for a
# primary key is the rowid, already 64-bit (BIGINT there would not be).
GrowingId = BigInteger().with_variant(Integer(), "sqlite")

schema_version = Table(
    "gpufleet_schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", BigInteger, nullable=False),
)

tenants = Table(
    "tenants",
    metadata,
    Column("tenant_id", String(128), primary_key=True),
    Column("name", String(256), nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

# A tenant's own grouping of reservations (`prj_` + ULID), issued by `projects.create`;
# its name is unique within the tenant, so the CLI may take it for the id.
projects = Table(
    "projects",
    metadata,
    Column("project_id", String(56), primary_key=True),
    Column("tenant_id", String(128), ForeignKey("tenants.tenant_id"), nullable=False),
    Column("name", String(128), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    UniqueConstraint("tenant_id", "name", name="uq_projects_tenant_name"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(32), primary_key=True),
    Column("tenant_id", String(128), ForeignKey("tenants.tenant_id"), nullable=False),
    # sha256 of the secret: keys are 256-bit random, so a fast hash is enough.
    Column("key_hash", String(64), nullable=False),
    Column("roles", String(256), nullable=False),
    Column("label", String(256), nullable=False, default=""),
    Column("created_at", BigInteger, nullable=False),
    Column("revoked_at", BigInteger, nullable=True),
)

pools = Table(
    "pools",
    metadata,
    Column("pool_id", String(57), primary_key=True),
    Column("name", String(256), nullable=False),
    Column("owner", String(128), ForeignKey("tenants.tenant_id"), nullable=False),
    Column("gpu_model", String(256), nullable=True),
    Column("archived", Boolean, nullable=False, default=False),
    Column("created_at", BigInteger, nullable=False),
)

pool_offers = Table(
    "pool_offers",
    metadata,
    Column("pool_id", String(57), ForeignKey("pools.pool_id"), primary_key=True),
    Column("tenant_id", String(128), primary_key=True),
    Column("created_at", BigInteger, nullable=False),
)

nodes = Table(
    "nodes",
    metadata,
    Column("node_id", String(128), primary_key=True),
    Column("pool_id", String(57), ForeignKey("pools.pool_id"), nullable=False, index=True),
    Column("hostname", String(256), nullable=False, default=""),
    Column("boot_id", String(64), nullable=False, default=""),
    Column("labels", JSON, nullable=False),
    Column("profile_id", String(128), nullable=True),
    Column("profile_version", Integer, nullable=True),
    Column("inventory_hash", String(128), nullable=False, default=""),
    Column("inventory", JSON, nullable=True),
    Column("interval_ms", Integer, nullable=False, default=5000),
    Column("last_seen", BigInteger, nullable=False),
    Column("reachable", Boolean, nullable=False, default=True),
    Column("reachable_since", BigInteger, nullable=False),
    Column("health", String(16), nullable=False, default="healthy"),
    Column("health_reasons", JSON, nullable=False),
    Column("health_since", BigInteger, nullable=False),
    Column("maintenance", Boolean, nullable=False, default=False),
    Column("maintenance_reason", Text, nullable=False, default=""),
    Column("maintenance_by", String(128), nullable=False, default=""),
    Column("maintenance_since", BigInteger, nullable=True),
    Column("provisioning", Boolean, nullable=False, default=True),
    Column("vcpu", Integer, nullable=False, default=0),
    Column("memory_gib", Integer, nullable=False, default=0),
    Column("hugepages_1gi", Integer, nullable=False, default=0),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    # r0002: the pool an agent reported while the node still held bookings in this one;
    # it moves when the last of them ends (SPEC §5, pool moves).
    Column("pending_pool_id", String(57), nullable=True),
    Index("ix_nodes_pending_pool", "pending_pool_id"),
    # r0005: why the node is held in provisioning for exceeding an expected shape (null:
    # it is not), and the atom counts per class an operator accepted (`domain.shapes`).
    Column("shape_hold", Text, nullable=True),
    Column("accepted_shape", JSON, nullable=True),
    # r0008: why the node is held in provisioning because another node holds one of its
    # physical devices, or an operator replaced it (null: it is not; `domain.physical_ids`).
    Column("duplicate_hold", Text, nullable=True),
)

# r0008: the one node that holds each physical device that is one device wherever it
# shows (GPU and MIG UUIDs, disk WWNs and serials, NIC card identities;
# `domain.physical_ids`). The primary key settles two replicas registering one host
# under two node ids.
device_identities = Table(
    "device_identities",
    metadata,
    Column("identity", String(160), primary_key=True),
    Column("node_id", String(128), nullable=False),
    Column("device_id", String(128), nullable=False),
    Column("since", BigInteger, nullable=False),
    Index("ix_device_identities_node", "node_id"),
)

atoms = Table(
    "atoms",
    metadata,
    Column("atom_id", String(256), primary_key=True),
    Column("node_id", String(128), ForeignKey("nodes.node_id"), nullable=False),
    Column("pool_id", String(57), nullable=False),
    Column("class", String(16), nullable=False),
    Column("device_id", String(128), nullable=False, default=""),
    Column("attrs", JSON, nullable=False),
    Column("health", String(16), nullable=False, default="healthy"),
    Column("health_reasons", JSON, nullable=False),
    # An atom that left the inventory is retired, not deleted: bookings may name it.
    Column("retired", Boolean, nullable=False, default=False),
    Index("ix_atoms_node", "node_id"),
    Index("ix_atoms_pool", "pool_id"),
)

node_events = Table(
    "node_events",
    metadata,
    Column("event_id", GrowingId, primary_key=True, autoincrement=True),
    Column("node_id", String(128), nullable=False),
    Column("pool_id", String(57), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("by", String(128), nullable=False, default="coordinator"),
    Column("at", BigInteger, nullable=False),
    Column("device_id", String(128), nullable=True),
    Index("ix_node_events_node", "node_id", "event_id"),
)

rollup = Table(
    "rollup",
    metadata,
    Column("pool_id", String(57), primary_key=True),
    Column("resource", String(32), primary_key=True),
    Column("total", BigInteger, nullable=False, default=0),
    Column("allocatable", BigInteger, nullable=False, default=0),
    Column("allocated", BigInteger, nullable=False, default=0),
    Column("reserved", BigInteger, nullable=False, default=0),
    Column("available", BigInteger, nullable=False, default=0),
    Column("provisioning", BigInteger, nullable=False, default=0),
    Column("unhealthy", BigInteger, nullable=False, default=0),
    Column("maintenance", BigInteger, nullable=False, default=0),
    Column("unreachable", BigInteger, nullable=False, default=0),
    Column("updated_at", BigInteger, nullable=False, default=0),
)

# v2
quotas = Table(
    "quotas",
    metadata,
    Column("tenant_id", String(128), primary_key=True),
    # "" means every pool of the tenant; a pool id limits one pool.
    Column("pool_id", String(57), primary_key=True),
    Column("resource", String(32), primary_key=True),
    Column("limit", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)

# v3: reservations and their bookings
reservations = Table(
    "reservations",
    metadata,
    Column("reservation_id", String(57), primary_key=True),
    Column("tenant_id", String(128), nullable=False),
    Column("pool_id", String(57), nullable=False),
    Column("project_id", String(56), nullable=True),
    # Stored: "booked" while live, or the terminal released/expired/preempted; scheduled,
    # active, noticed and completed are derived from the clock when read.
    Column("state", String(16), nullable=False),
    Column("spot", Boolean, nullable=False),
    Column("binding", String(8), nullable=False),
    Column("start", BigInteger, nullable=False),
    Column("end", BigInteger, nullable=False),
    Column("lease_seconds", Integer, nullable=True),
    Column("lease_expires_at", BigInteger, nullable=True),
    Column("preempt_at", BigInteger, nullable=True),
    Column("resources", JSON, nullable=False),
    Column("gang", JSON, nullable=True),
    Column("atoms", JSON, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("ended_at", BigInteger, nullable=True),
    # r0002: {reason, since, atoms} while one of its atoms is out of service, else null.
    Column("at_risk", JSON, nullable=True),
    Index("ix_reservations_tenant", "tenant_id", "created_at", "reservation_id"),
    Index("ix_reservations_live", "state", "lease_expires_at"),
)

bookings = Table(
    "bookings",
    metadata,
    Column("booking_id", GrowingId, primary_key=True, autoincrement=True),
    Column("reservation_id", String(57), nullable=False, index=True),
    Column("tenant_id", String(128), nullable=False),
    Column("pool_id", String(57), nullable=False),
    Column("node_id", String(128), nullable=False),
    Column("atom_id", String(256), nullable=False),
    Column("class", String(16), nullable=False),
    Column("spot", Boolean, nullable=False),
    Column("start", BigInteger, nullable=False),
    # Ended early (release, expiry, preemption) by moving `end`; a booking that never
    # started ends at its start and then overlaps nothing.
    Column("end", BigInteger, nullable=False),
    Index("ix_bookings_pool_end", "pool_id", "end"),
    Index("ix_bookings_atom", "atom_id", "start"),
    # r0002: a node's live bookings (pool moves, at-risk reservations).
    Index("ix_bookings_node_end", "node_id", "end"),
)

# r0002: what each booking claims on its physical devices (`coordinator.domain.claims`).
# On PostgreSQL two exclusion constraints (not declared here: metadata cannot carry
# them; r0017) refuse two claims on one device's capacity for overlapping time.
device_claims = Table(
    "device_claims",
    metadata,
    Column("claim_id", GrowingId, primary_key=True, autoincrement=True),
    Column("reservation_id", String(57), nullable=False, index=True),
    Column("node_id", String(128), nullable=False),
    Column("device", String(256), nullable=False),
    Column("part", String(256), nullable=False),
    Column("exclusive", Boolean, nullable=False),
    Column("form", String(64), nullable=False),
    Column("start", BigInteger, nullable=False),
    Column("end", BigInteger, nullable=False),
    # r0008: the device is one device wherever it shows (`physical_ids`): a claim of
    # another node on it for overlapping time is refused too (a PostgreSQL exclusion
    # constraint, an SQLite trigger).
    Column("physical", Boolean, nullable=False, default=False, server_default=false()),
)
# r0013: SQLite's physical-claim trigger looks for another node's claim on the device;
# without this index each GPU claim row read the whole table (1,172 of 1,530 ms of 256
# creates at 1,000 nodes). PostgreSQL has it too, so one schema serves both (its
# exclusion constraint checks through its own gist index).
Index(
    "ix_device_claims_physical", device_claims.c.device, device_claims.c.start,
    sqlite_where=device_claims.c.physical, postgresql_where=device_claims.c.physical,
)  # fmt: skip

scalar_bookings = Table(
    "scalar_bookings",
    metadata,
    Column("booking_id", GrowingId, primary_key=True, autoincrement=True),
    Column("reservation_id", String(57), nullable=False, index=True),
    Column("tenant_id", String(128), nullable=False),
    Column("pool_id", String(57), nullable=False),
    # Empty for pool-level bookings (interval reservations of memory).
    Column("node_id", String(128), nullable=False),
    Column("resource", String(32), nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("spot", Boolean, nullable=False),
    Column("start", BigInteger, nullable=False),
    Column("end", BigInteger, nullable=False),
    Index("ix_scalar_bookings_pool_end", "pool_id", "end"),
)

idempotency = Table(
    "idempotency",
    metadata,
    Column("tenant_id", String(128), primary_key=True),
    Column("endpoint", String(64), primary_key=True),
    Column("key", String(128), primary_key=True),
    Column("body_hash", String(64), nullable=False),
    Column("status", Integer, nullable=False),
    Column("response", JSON, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

# v4: interval reservations of pool memory (seed 002); their quantities live in
# scalar_bookings (node_id "", resource "memoryGiB") so the rollup and the placer see them.
interval_reservations = Table(
    "interval_reservations",
    metadata,
    Column("reservation_id", String(64), primary_key=True),
    Column("tenant_id", String(128), nullable=False),
    Column("pool_id", String(57), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("intervals", JSON, nullable=False),
    # r0005: {reason, since, atoms} while the pool has promised more memory than it has in
    # service in a quarter this reservation holds (`domain.pool_memory`), else null.
    Column("at_risk", JSON, nullable=True),
    Index("ix_interval_reservations_tenant", "tenant_id", "created_at", "reservation_id"),
)

# r0005: expected node shapes (atom counts per class), per pool (profile_id "") or per
# host profile version (pool_id ""), set by operators (`domain.shapes`).
expected_shapes = Table(
    "expected_shapes",
    metadata,
    Column("pool_id", String(57), primary_key=True),
    Column("profile_id", String(128), primary_key=True),
    Column("profile_version", Integer, primary_key=True),
    Column("counts", JSON, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("updated_by", String(256), nullable=False),
)

# v5: per-pool change counters, so an in-memory snapshot can tell it is current with one
# indexed read inside the booking transaction.
pool_versions = Table(
    "pool_versions",
    metadata,
    Column("pool_id", String(57), primary_key=True),
    Column("nodes_version", BigInteger, nullable=False, default=0),
    Column("bookings_version", BigInteger, nullable=False, default=0),
)

# Revision 0003: alerts written in the same transaction as the transition they report
# (the outbox), published to JetStream by the leader and marked sent once acknowledged.
# r0006: used and utilization-weighted unit-ms per hour, reservation ("" for use no
# booking covered), node and unit (GPU or MIG UUID) (`coordinator.domain.gpu_use_accrual`);
# r0015: and tenant (of unbooked use: its owners', "" unattributed), so two tenants'
# unbooked use of one GPU in one hour are two buckets.
gpu_use = Table(
    "gpu_use",
    metadata,
    Column("hour", BigInteger, primary_key=True),
    Column("reservation_id", String(57), primary_key=True),
    Column("node_id", String(128), primary_key=True),
    Column("unit", String(128), primary_key=True),
    Column("resource", String(16), primary_key=True),
    Column("tenant_id", String(128), primary_key=True),
    Column("pool_id", String(57), nullable=False),
    Column("project_id", String(56), nullable=True),
    Column("used_ms", BigInteger, nullable=False),
    Column("weighted_ms", BigInteger, nullable=False),
    # r0007: of used_ms, the time with no utilization figure (MIG).
    Column("unknown_ms", BigInteger, nullable=False, server_default="0"),
    # r0012: of used_ms, the time under the idle threshold (chargeback's unused).
    Column("idle_ms", BigInteger, nullable=False, server_default="0"),
    Index("ix_gpu_use_reservation", "reservation_id"),
)

# r0011: the use conditions said and not yet ended (`coordinator.domain.gpu_use_conditions`),
# so a new leader goes on from them: one row per condition, by its key.
use_conditions = Table(
    "use_conditions",
    metadata,
    Column("key", String(640), primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("pool_id", String(57), nullable=False),
    Column("node_id", String(128), nullable=False),
    Column("device_id", String(128), nullable=False),
    Column("owner_kind", String(16), nullable=False),
    Column("owner", String(256), nullable=False),
    Column("reservation_id", String(57), nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("since", BigInteger, nullable=False),
)

# r0012: GPU memory held per quarter, tenant ("" unattributed) and pool (issue 35).
memory_use = Table(
    "memory_use",
    metadata,
    Column("quarter", BigInteger, primary_key=True),
    Column("tenant_id", String(128), primary_key=True),
    Column("pool_id", String(57), primary_key=True),
    Column("mib_ms", BigInteger, nullable=False),
    Column("peak_mib", BigInteger, nullable=False),
)

alert_outbox = Table(
    "alert_outbox",
    metadata,
    Column("seq", GrowingId, primary_key=True, autoincrement=True),
    Column("alert_id", String(64), nullable=False),
    Column("payload", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("sent_at", BigInteger, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Index("ix_alert_outbox_alert_id", "alert_id", unique=True),
    Index("ix_alert_outbox_unsent", "sent_at", "seq"),
)

# Revision 0003: the leader's fencing token. One row; a replica that takes the leader
# lock bumps `epoch`, and every leader write transaction holds the row FOR SHARE and
# checks it is still its own, so a bump waits for the old leader's writes in flight.
leader_term = Table(
    "leader_term",
    metadata,
    Column("term_id", Integer, primary_key=True, autoincrement=False),
    Column("epoch", BigInteger, nullable=False),
    Column("holder", String(256), nullable=False),
    Column("since", BigInteger, nullable=False),
)
