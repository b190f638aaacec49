"""Physical identity is fleet-wide (issue 31).

`device_identities`: one row per physical device that is one device wherever it shows
(`gpu:<GPU UUID>`, `mig:<MIG UUID>`, `disk:<WWN or serial>`), naming the one node that
holds it. Its primary key is what makes two replicas registering one host under two
node ids agree: the second insert waits for the first and finds it taken.
`nodes.duplicate_hold`: why a node is held in provisioning because another node holds
one of its devices, or an operator replaced it (null: it is not).

`device_claims.physical`: the claim's device is one device wherever it shows (a GPU UUID,
a disk WWN or serial); two such claims of two node ids for overlapping time are refused
(PostgreSQL: an exclusion constraint; SQLite: triggers on insert and on a change of
node). Live claims are marked unless another node's overlapping claim already holds the
device: that double promise predates this revision, and the constraint could not be
added over it; those rows stay unmarked until they end.

Live nodes' current atoms are backfilled, the lowest node id first where two nodes
already share a device (those nodes are not held: nothing here judges them; the next
inventory of the one that lost does). The identity rules are copied here, frozen, rather
than imported: this revision never changes.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

_GPU_CLASSES = ("gpu", "gpu.mig", "gpu.slot")


def _identities(cls: str, device: str, attrs: dict[str, object]) -> dict[str, str]:
    if not device or device.startswith("missing:") or attrs.get("missing"):
        return {}
    if cls in _GPU_CLASSES:
        out = {f"gpu:{device}": device}
        mig = attrs.get("uuid")
        if cls == "gpu.mig" and isinstance(mig, str) and mig:
            out[f"mig:{mig}"] = mig
        return out
    if cls == "disk" and device.startswith(("wwn:", "serial:")):
        return {f"disk:{device}": device}
    return {}


_PHYSICAL = ("GPU-", "wwn:", "serial:")
_OVERLAP = (
    "c.device = NEW.device AND c.node_id <> NEW.node_id AND c.physical"
    ' AND c.start < NEW."end" AND NEW.start < c."end" AND c.start < c."end"'
)


def _claims() -> None:
    with op.batch_alter_table("device_claims") as batch:
        batch.add_column(
            sa.Column("physical", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    conn = op.get_bind()
    now = int(time.time() * 1000)
    rows = conn.execute(
        sa.text(
            'SELECT claim_id, node_id, device, start, "end" FROM device_claims'
            ' WHERE "end" > :now AND "end" > start ORDER BY claim_id'
        ),
        {"now": now},
    ).all()
    per_device: dict[str, list[tuple[int, str, int, int]]] = {}
    for claim_id, node_id, device, start, end in rows:
        if device.startswith(_PHYSICAL):
            per_device.setdefault(device, []).append((claim_id, node_id, start, end))
    marked = [
        claim_id
        for claims in per_device.values()
        for claim_id, node_id, start, end in claims
        if not any(n != node_id and s < end and start < e for _, n, s, e in claims)
    ]
    for i in range(0, len(marked), 1000):
        conn.execute(
            sa.text("UPDATE device_claims SET physical = true WHERE claim_id IN :ids").bindparams(
                sa.bindparam("ids", expanding=True)
            ),
            {"ids": marked[i : i + 1000]},
        )
    if conn.dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE device_claims ADD CONSTRAINT device_claims_physical EXCLUDE USING gist"
            ' (device WITH =, node_id WITH <>, int8range(start, "end") WITH &&) WHERE (physical)'
        )
        return
    # Before an insert the new row is not in the table (and its claim_id is not known
    # yet); before an update it is, and is not its own rival.
    for name, event, other in (
        ("insert", "INSERT", ""),
        ("node", "UPDATE OF node_id, physical", " AND c.claim_id <> NEW.claim_id"),
    ):
        op.execute(
            f"CREATE TRIGGER device_claims_physical_{name} BEFORE {event} ON device_claims"
            ' WHEN NEW.physical AND NEW.start < NEW."end" AND EXISTS (SELECT 1 FROM'
            f" device_claims c WHERE {_OVERLAP}{other})"
            " BEGIN SELECT RAISE(ABORT, 'device_claims_physical'); END"
        )


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("duplicate_hold", sa.Text(), nullable=True))
    op.create_table(
        "device_identities",
        sa.Column("identity", sa.String(160), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("since", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("identity"),
    )
    op.create_index("ix_device_identities_node", "device_identities", ["node_id"])
    conn = op.get_bind()
    a = sa.table(
        "atoms",
        sa.column("node_id", sa.String), sa.column("class", sa.String),
        sa.column("device_id", sa.String), sa.column("attrs", sa.JSON),
        sa.column("retired", sa.Boolean),
    )  # fmt: skip
    rows = conn.execute(
        sa.select(a.c.node_id, a.c["class"], a.c.device_id, a.c.attrs)
        .where(a.c.retired.is_(False))
        .order_by(a.c.node_id)
    ).all()
    now = int(time.time() * 1000)
    held: dict[str, dict[str, object]] = {}
    for node_id, cls, device, attrs in rows:
        for identity, device_id in _identities(cls, device or "", attrs or {}).items():
            held.setdefault(
                identity,
                {"identity": identity, "node_id": node_id, "device_id": device_id, "since": now},
            )
    if held:
        ids = sa.table(
            "device_identities",
            sa.column("identity", sa.String), sa.column("node_id", sa.String),
            sa.column("device_id", sa.String), sa.column("since", sa.BigInteger),
        )  # fmt: skip
        conn.execute(ids.insert(), [held[k] for k in sorted(held)])
    _claims()


def downgrade() -> None:
    raise NotImplementedError("not downgraded; restore a backup instead")
