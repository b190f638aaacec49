"""PostgreSQL's four claim constraints become two (issue 30 point 8).

Every claim row paid for four gist exclusion constraints, one index insert and one index
probe each, and a batch of 32 creates writes about 96 of them: `device_claims` was the
dearest statement of a create (6.3 ms of a ~30 ms batch). Two pairs check one key each
and differ only in which pairs of rows conflict, so each pair becomes one constraint:

- `device_claims_capacity` replaces `_exclusive` and `_shared`: two rows of one
  (node, device, part) overlapping in time conflict unless both are shared. Each row
  also carries a slot range — unbounded for an exclusive row, its own claim id for a
  shared one — and the rows conflict only where the slots overlap too: an exclusive
  row's slot overlaps every slot, two shared rows' never do.
- `device_claims_device` replaces `_one_form` and `_physical`: two rows of one device
  overlapping in time conflict when they name another form of it or, for a physical
  device (a GPU UUID, a disk WWN or serial, a NIC's own identity: `physical`), another
  node. A physical device's rows are keyed by the device alone and compared on
  node and form together; any other device's rows by node and device, as before, where
  the node part of the comparison is then always equal. `physical` is a function of the
  device id (`coordinator.domain.physical_ids.is_physical_device`), so one device's rows
  are all keyed alike; the node move of `nodes.replace` clears it on rows while they move
  and sets it again once they are all on the new node, where each is checked again.

The pairs refused are exactly those the four refused (test_device_claims_db, the
physical identity tests). Measured on 96-row batches into a table of 4,000 rows, 300
alternating rounds: 6.14 ms at the median with the four, 4.59 ms with the two. Equality
parts stay hashed as in 0016; the `<>` part compares the real node and form, joined by
`/`, which neither a node id nor a form contains. SQLite has no exclusion constraints:
nothing to do there.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision: str | None = "0016"
branch_labels: str | None = None
depends_on: str | None = None

# Frozen here (a released revision never changes).
DURING = 'int8range(start, "end") WITH &&'
NODE_DEVICE = "hashtextextended(device, hashtextextended(node_id, 0))"
NODE_DEVICE_PART = f"hashtextextended(part, {NODE_DEVICE})"
SLOT = "(CASE WHEN exclusive THEN int8range(NULL, NULL) ELSE int8range(claim_id, claim_id + 1) END)"
DEVICE_KEY = f"(CASE WHEN physical THEN hashtextextended(device, 0) ELSE {NODE_DEVICE} END)"
HOLDER = "(node_id || '/' || form)"

DROPPED = (
    "device_claims_exclusive",
    "device_claims_shared",
    "device_claims_one_form",
    "device_claims_physical",
)
ADDED = (
    (
        "device_claims_capacity",
        f"EXCLUDE USING gist ({NODE_DEVICE_PART} WITH =, {SLOT} WITH &&, {DURING})",
    ),
    (
        "device_claims_device",
        f"EXCLUDE USING gist ({DEVICE_KEY} WITH =, {HOLDER} WITH <>, {DURING})"
        " WHERE (device <> '')",
    ),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in DROPPED:
        op.execute(f"ALTER TABLE device_claims DROP CONSTRAINT {name}")
    for name, definition in ADDED:
        op.execute(f"ALTER TABLE device_claims ADD CONSTRAINT {name} {definition}")


def downgrade() -> None:
    raise NotImplementedError("not downgraded; restore a backup instead")
