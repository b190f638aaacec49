"""A gang of whole nodes is checked as a whole against the pool's memory commitments
(SPEC §5), on SQLite and PostgreSQL. Before: each member was checked alone, so two
512 GiB nodes were both booked whole while 512 GB of the pool's 1024 was already
committed through the interval API — 1536 of 1024 GiB promised."""

from __future__ import annotations

from coordinator.ledger import Ledger
from coordinator.services.intervals import IntervalsBooked
from coordinator.services.reservations import Created, Refused
from tests.rig import HOUR, TENANT, Q, Rig


async def test_a_whole_node_gang_does_not_overcommit_pool_memory(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=2, gpus=1, memory_gib=512)
    booked = await rig.intervals.book(TENANT, rig.quarters(0, 512), pool, None)
    assert isinstance(booked, IntervalsBooked)
    now = rig.clock.now_ms()
    start = now - now % Q + HOUR  # the committed quarter
    gang = {"binding": "node", "gang": {"size": 2}, "start": start, "duration": "15m"}
    out = await rig.reservations.create(rig.request(pool, "g", **gang))
    assert isinstance(out, Refused) and out.error.code == "CAPACITY_NOT_AVAILABLE"
    assert "memoryGiB" in out.error.message or "memory" in out.error.message
    # One node alone fits in what is left; after the quarter, both do.
    one = await rig.reservations.create(
        rig.request(pool, "one", binding="node", start=start, duration="15m")
    )
    assert isinstance(one, Created)
    later = {"binding": "node", "gang": {"size": 2}, "start": start + Q, "duration": "15m"}
    both = await rig.reservations.create(rig.request(pool, "later", **later))
    assert isinstance(both, Created) and len({a.node_id for a in both.reservation.atoms}) == 2
