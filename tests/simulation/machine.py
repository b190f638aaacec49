"""The ledger simulation as a hypothesis state machine: random sequences of fleet
changes (`fleet_rules.py`), bookings and clock moves (`booking_rules.py`) driven through
the real services and ledger, the reference model (`reference.py`) checked after every
step; and the periodic rebuild, which must find nothing to correct.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from coordinator.api.http.render import reservation
from coordinator.api.shapes.base import dump
from coordinator.domain.model import Quota
from coordinator.domain.reservation import Reservation
from coordinator.ledger import ReservationFilter
from coordinator.ledger.database import lock_pool
from coordinator.ledger.rollups import rebuild_pool
from tests.simulation import reference as ref
from tests.simulation.base import (
    NOTICE_MS,
    Glue,
    InvariantViolation,
    MachineBase,
    left_short,
)
from tests.simulation.booking_rules import BookingRules
from tests.simulation.fleet import Links, SimHost
from tests.simulation.fleet_rules import FleetRules
from tests.simulation.ledger_view import LedgerView, read_outbox
from tests.simulation.straight_rules import StraightRules
from tests.simulation.use_rules import UseRules

__all__ = [
    "NOTICE_MS",
    "Glue",
    "InvariantViolation",
    "LedgerMachine",
    "MachineBase",
    "machine_for",
]


class LedgerMachine(FleetRules, BookingRules, StraightRules, UseRules):
    # -- setup ----------------------------------------------------------------------------

    @initialize(
        gpu_quota=st.sampled_from([None, 3, 5]),
        memory_quota=st.sampled_from([None, 48, 96]),
        b_pool_memory=st.sampled_from([None, 32]),
        preload=st.sampled_from([True, False]),
    )
    def setup(
        self,
        gpu_quota: int | None,
        memory_quota: int | None,
        b_pool_memory: int | None,
        preload: bool,
    ) -> None:
        self.run(self._setup(gpu_quota, memory_quota, b_pool_memory, preload))

    async def _setup(
        self,
        gpu_quota: int | None,
        memory_quota: int | None,
        b_pool_memory: int | None,
        preload: bool,
    ) -> None:
        led, now = self.ledger, self.now
        a, b = self.tenants
        await led.tenants.create(a, "Sim A", now)
        await led.tenants.create(b, "Sim B", now)
        self.pools = self.pool_ids()
        for pool_id in self.pools:
            await led.pools.create(pool_id, "sim", a, None, now)
        await led.pools.offer(self.pools[0], b, now)
        if gpu_quota is not None:
            await led.quotas.set(Quota(a, None, "gpu", gpu_quota), now)
        if memory_quota is not None:
            await led.quotas.set(Quota(a, None, "memoryGiB", memory_quota), now)
        if b_pool_memory is not None:
            await led.quotas.set(Quota(b, self.pools[0], "memoryGiB", b_pool_memory), now)
        # Every shape is bookable from the start: whole GPUs everywhere, a MIG-partitioned
        # and a time-sliced GPU, a NIC with VFs and one without, two nodes in one rack;
        # the second node's four GPUs bridged in a chain 0–1–2–3 (cliques of two only).
        for i, (pool, rack) in enumerate(((0, "r0"), (0, "r0"), (1, "r1"))):
            links: Links = "chain" if i == 1 else "all"
            gpus = 4 if i == 1 else 3 - pool
            host = SimHost.build(f"{self.ns}-n{i}", self.pools[pool], rack, gpus, 1, links)
            if i == 0:
                host.gpus[-1].mode, host.gpus[-1].parts = "mig", 2
            if i == 1:
                host.gpus[-1].mode, host.gpus[-1].parts = "slot", 2
            host.nics[0].vfs = 2 if i != 1 else 0
            await self._register(host)
        self.ready = True
        if preload:
            # A fleet is rarely idle: one form of every device kind is held from the
            # start (a whole GPU, a MIG instance, a slot, a VF; one spot), so the first
            # fleet change already happens under bookings.
            n0, n1, n2 = self.hosts
            for host, dev, spot in (
                (n0, n0.gpus[0], False),
                (n0, n0.gpus[-1], False),
                (n1, n1.gpus[-1], True),
                (n2, n2.nics[0], False),
            ):
                await self._book_forms(host, dev, 1, spot=spot, later=None)

    # -- after every step --------------------------------------------------------------------

    @invariant()
    def ledger_is_true(self) -> None:
        if self.ready:
            self.run(self._check())

    async def _check(self) -> None:
        now = self.now
        view = await self.view()
        self.traced(view)
        problems = ref.double_bookings(view)
        problems += ref.quota_overruns(view)
        problems += ref.rollup_mismatches(view, self.pools, now)
        problems += ref.moved_bookings(view, now)
        shown: dict[str, Reservation] = {}
        for tenant_id in self.tenants:
            found = ReservationFilter(tenant_id=tenant_id)
            for res in await self.ledger.listing.page(found, None, 1000, now):
                shown[res.reservation_id] = res
        states = {k: r.state(now) for k, r in shown.items()}
        problems += ref.state_mismatches(self.models.values(), states, now, self.ticks)
        problems += ref.holding_mismatches(
            view,
            [
                ref.Holding(
                    m.reservation_id,
                    states.get(m.reservation_id, "?"),
                    m.start,
                    m.held_until(),
                    m.atoms,
                )
                for m in self.models.values()
            ],
            now,
        )
        problems += await self._truth_under_change(view, shown, now)
        # Issue 31: a node that left a pool did not leave its promises short.
        problems += left_short(self.placed, view, now)
        self.placed = {n.node_id: n.pool_id for n in view.nodes.values()}
        self.fail(problems, "the step")

    @precondition(lambda self: self.ready)
    @rule(pool=st.integers(0, 1))
    def rebuild(self, pool: int) -> None:
        """The periodic rebuild (every 10 s in the coordinator) finds nothing to correct
        (it runs as Ledger.rebuild_all does, on this sequence's pools only)."""
        self.run(self._no_drift(self.pools[pool]))

    async def _no_drift(self, pool_id: str) -> None:
        async with self.db.transaction() as conn:
            await lock_pool(conn, pool_id)
            drift = await rebuild_pool(conn, pool_id, self.now)
        self.fail(
            [f"pool {pool_id}: the rebuild corrected {drift} drifted rows"] if drift else [],
            "the periodic rebuild",
        )
        self.count("rebuilt")

    async def _truth_under_change(
        self, view: LedgerView, shown: dict[str, Reservation], now: int
    ) -> list[str]:
        """SPEC §5 at-risk flags and their alerts, pool-change holds, and the outbox: every
        alert announced since the last step is in it (written in the transaction of the
        change it reports), and each reservation's risk change has its alert there."""
        problems = []
        announced = self.alerts.alerts[self.alerts_seen :]
        self.alerts_seen = len(self.alerts.alerts)
        written = await read_outbox(self.db, self.outbox_seen)
        if written:
            self.outbox_seen = written[-1][0]
        ours = set(self.models)
        new_alerts = [a for _, a in written if a.reservation_id in ours]
        in_outbox = {a.alert_id for _, a in written}
        problems += [
            f"alert {a.kind} {a.alert_id} ({a.reservation_id or a.node_id}) was announced "
            "but is not in the outbox"
            for a in announced
            if a.alert_id not in in_outbox and a.alert_id not in self.outbox_ids
        ]
        self.outbox_ids |= in_outbox
        for rid, m in self.models.items():
            res = shown.get(rid)
            if res is None or res.state(now) not in ref.LIVE_STATES:
                self.at_risk.pop(rid, None)
                continue
            flag = dump(reservation(res, now)).get("atRisk")
            risky, unsaid = ref.at_risk_atoms(view, m)
            if unsaid:
                self.at_risk[rid] = bool(flag)
                continue
            if bool(flag) != bool(risky):
                problems.append(f"{rid}: atRisk {flag}, atoms at risk {sorted(risky)}")
            elif flag and sorted(flag.get("atoms", sorted(risky))) != sorted(risky):
                problems.append(
                    f"{rid}: atRisk names {flag.get('atoms')}, expected {sorted(risky)}"
                )
            before = self.at_risk.get(rid, False)
            if bool(risky) != before:
                kind = "reservation.atRisk" if risky else "reservation.recovered"
                if not any(a.kind == kind and a.reservation_id == rid for a in new_alerts):
                    problems.append(f"{rid}: no {kind} alert when it changed")
            self.at_risk[rid] = bool(risky)
        for host in self.hosts:
            node = view.nodes.get(host.node_id)
            if node is None or node.pool_id == host.pool_id:
                continue
            # Held in maintenance for the move; an operator's reason may stand in for
            # `pool change pending` meanwhile (docs/api.md), the hold may not.
            if not node.maintenance or node.pending_pool != host.pool_id:
                problems.append(
                    f"{host.node_id} reported pool {host.pool_id}, still in {node.pool_id}, "
                    f"maintenance {node.maintenance} ({node.maintenance_reason!r}), "
                    f"pending {node.pending_pool}"
                )
        return problems


def machine_for(glue: Glue, base: type[LedgerMachine] = LedgerMachine) -> type[LedgerMachine]:
    """A machine class bound to one test's loop and ledger."""
    return type(base.__name__, (base,), {"glue": glue})
