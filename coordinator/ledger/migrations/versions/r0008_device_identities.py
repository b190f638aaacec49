"""Physical identity is fleet-wide (issue 31).

`device_identities`: one row per physical device that is one device wherever it shows
(`gpu:<GPU UUID>`, `mig:<MIG UUID>`, `disk:<WWN or serial>`), naming the one node that
holds it. Its primary key is what makes two replicas registering one host under two
node ids agree: the second insert waits for the first and finds it taken.
`nodes.duplicate_hold`: why a node is held in provisioning because another node holds
one of its devices, or an operator replaced it (null: it is not).

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


def downgrade() -> None:
    raise NotImplementedError("not downgraded; restore a backup instead")
