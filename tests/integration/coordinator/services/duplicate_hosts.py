"""What the physical-identity tests (GPUs, MIG and disks in test_physical_identity, NICs
in test_nic_identity) share: a node's duplicate hold as the catalog shows it, a ledger
put back as an upgrade to revision 0008 leaves it, and one host registered under two
node ids through two replicas at once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy import text

from coordinator.ledger import Database, Ledger
from coordinator.services.node_records import record_inventory
from shared.wire import Inventory
from tests.factories import renamed


async def hold_reason(ledger: Ledger, node_id: str) -> str:
    """The node's duplicate-device hold reason ("" when it is not held for one); a hold
    and provisioning always go together."""
    node = await ledger.catalog.node(node_id)
    assert node is not None
    assert node.state.provisioning == bool(node.duplicate_hold), node_id
    return node.duplicate_hold


async def as_upgraded(database_url: str, *more: str) -> None:
    """Every node unheld, as revision 0008 leaves a ledger (`more`: other statements)."""
    db = Database(database_url)
    try:
        async with db.transaction() as conn:
            await conn.execute(text("UPDATE nodes SET provisioning = false, duplicate_hold = NULL"))
            for statement in more:
                await conn.execute(text(statement))
    finally:
        await db.dispose()


async def registered_twice_at_once(
    ledger: Ledger, database_url: str, hosts: Sequence[Inventory], now: int
) -> None:
    """Each host registered as itself through `ledger` and as `<id>-again` through a
    second replica's ledger, all at once; then exactly one id of each host is held."""
    other = await Ledger.open(database_url)
    try:
        await asyncio.gather(
            *(record_inventory(ledger, inv, now) for inv in hosts),
            *(record_inventory(other, renamed(inv, f"{inv.node_id}-again"), now) for inv in hosts),
        )
    finally:
        await other.close()
    for inv in hosts:
        reasons = [await hold_reason(ledger, n) for n in (inv.node_id, f"{inv.node_id}-again")]
        assert sorted(bool(r) for r in reasons) == [False, True], reasons
