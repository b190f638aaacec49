"""Chargeback's truth through the ledger, on SQLite and PostgreSQL (SPEC §13, issue 35):
for any interval reservations and any memory use written as the use pass writes it, in
any number of flushes, the consumption read says `covered + unused = reserved` and
`covered + onDemand = used` per row, counts every MiB-ms exactly once, under one tenant,
and reserves nothing for unattributed use."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.consumption import (
    UNATTRIBUTED,
    MemoryAccrued,
    MemoryKey,
    accrue_memory,
    reserved_mib_ms,
)
from coordinator.domain.intervals import INTERVAL_MS as Q
from coordinator.domain.intervals import Interval
from coordinator.domain.tenant_rules import parse_tenant_rules
from coordinator.ledger import Ledger
from coordinator.services.consumption import memory_consumption
from shared.wire import OwnerMemory

POOLS = ("pool_a", "pool_b")
# Pods of the ml namespace are beta's by the operator's rule; a dead reservation's use
# matches none and stays unattributed.
RULES = parse_tenant_rules('[[rule]]\nk8s_namespace = "ml"\ntenant = "beta"\n', "t.toml")
TENANTS = ("acme", "beta")
_STRETCH = itertools.count(1)

procs_st = st.lists(
    st.tuples(
        st.sampled_from(["rsv_a", "rsv_b", "pod-1", "pod-2", "rsv_dead"]), st.integers(1, 40_000)
    ),
    max_size=4,
)
node_st = st.tuples(st.sampled_from(POOLS), procs_st)
passes_st = st.lists(
    st.tuples(st.integers(1, Q), st.dictionaries(st.sampled_from(["n1", "n2"]), node_st)),
    min_size=1,
    max_size=5,
)
reserved_st = st.dictionaries(
    st.tuples(st.sampled_from(TENANTS), st.sampled_from(POOLS), st.integers(0, 5)),
    st.integers(1, 16).map(lambda k: 4 * k),
    max_size=8,
)


def test_any_reservations_and_use_split_exactly(database_url: str) -> None:
    with asyncio.Runner() as runner:
        ledger = runner.run(Ledger.open(database_url))
        try:

            @settings(max_examples=40, deadline=None)
            @given(reserved_st, passes_st)
            def check(
                reserved: dict[tuple[str, str, int], int],
                passes: list[tuple[int, dict[str, tuple[str, list[tuple[str, int]]]]]],
            ) -> None:
                base = next(_STRETCH) * 1000 * Q
                written = runner.run(_reserve(ledger, base, reserved))
                now, held = base, 0
                tenant_of = {"rsv_a": "acme", "rsv_b": "beta"}
                for gap, nodes in passes:
                    a, now = now, now + gap
                    uses = {
                        n: [OwnerMemory(owner=o, current_mib=mib, owner_kind="pod",
                                        k8s_namespace="ml" if o == "pod-1" else "")
                            if not o.startswith("rsv") else
                            OwnerMemory(owner=o, current_mib=mib, owner_kind="reservation")
                            for o, mib in ps]
                        for n, (_, ps) in nodes.items()
                    }  # fmt: skip
                    pools = {n: pool for n, (pool, _) in nodes.items()}
                    windows = dict.fromkeys(nodes, (a, now))
                    acc = accrue_memory(uses, tenant_of, pools, windows, RULES)
                    held += (now - a) * sum(mib for _, ps in nodes.values() for _, mib in ps)
                    runner.run(ledger.gpu_use.record({}, [], [], memory=acc))
                rows = runner.run(memory_consumption(ledger, base, base + 8 * Q, None, None))
                for r in rows:
                    assert r.covered + r.unused == r.reserved
                    assert r.covered + r.on_demand == r.used
                    assert min(r.covered, r.unused, r.on_demand) >= 0
                assert sum(r.used for r in rows) == held
                assert sum(r.reserved for r in rows) == written
                keys = [(r.quarter, r.tenant_id, r.pool_id) for r in rows]
                assert len(keys) == len(set(keys))
                assert all(r.reserved == 0 for r in rows if r.tenant_id == UNATTRIBUTED)
                # A tenant's own read is its rows of the whole read, nothing else.
                for tenant in TENANTS:
                    own = runner.run(memory_consumption(ledger, base, base + 8 * Q, tenant, None))
                    assert own == [r for r in rows if r.tenant_id == tenant]

            check()
        finally:
            runner.run(ledger.close())


async def _reserve(ledger: Ledger, base: int, reserved: dict[tuple[str, str, int], int]) -> int:
    """Book each (tenant, pool, quarter)'s GB as an interval reservation; its MiB-ms."""
    total = 0
    for (tenant, pool, k), gb in sorted(reserved.items()):
        async with ledger.transaction() as uow:
            await uow.intervals.book(
                tenant, pool, [Interval(base + k * Q, base + (k + 1) * Q, gb)], base
            )
            await uow.commit()
        total += reserved_mib_ms(gb)
    return total


def test_one_flush_or_many_read_the_same(database_url: str) -> None:
    """The upsert adds time and keeps the larger peak, as the watch's memory does."""
    key = MemoryKey(Q, "acme", "pool_a")

    async def run() -> MemoryAccrued:
        ledger = await Ledger.open(database_url)
        try:
            await ledger.gpu_use.record({}, [], [], memory={key: MemoryAccrued(10, 7)})
            await ledger.gpu_use.record({}, [], [], memory={key: MemoryAccrued(5, 3)})
            return (await ledger.memory_use.used(0, 2 * Q))[key]
        finally:
            await ledger.close()

    assert asyncio.run(run()) == MemoryAccrued(15, 7)
