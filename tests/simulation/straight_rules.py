"""Creates straight after a change (issue 31): a fleet change — maintenance switched on,
a pool move, a device's new form — and at once a create, with no read of the pool in
between (no preview), on this sequence's ledger or on a second coordinator replica's (a
second `Ledger` on the same database, with its own snapshot cache). Every other create
of the simulation previews first, and a preview reloads what changed: a create that
sees a change only because something read the pool before it passes there and breaks
here. The create is judged like any other (`BookingRules._create`): a node in
maintenance, another pool's node, an old form or a device another replica booked is
never booked; a refusal must be one the reference shares.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.simulation.base import GPU_FORMS, MachineBase
from tests.simulation.fleet import SimGpu
from tests.simulation.requests import SHAPES, create_body

CHANGES = ("nothing", "maintenance", "pool move", "reconfigure")


class StraightRules(MachineBase):
    @precondition(lambda self: self.ready)
    @rule(
        h=st.integers(0, 9),
        change=st.sampled_from(CHANGES),
        replica=st.booleans(),
        shape=st.sampled_from(list(SHAPES)),
        count=st.integers(1, 3),
    )
    def change_then_create(
        self, h: int, change: str, replica: bool, shape: str, count: int
    ) -> None:
        """`change` on the `h`th host (those holding bookings first), then a create in the
        pool the change concerns — for a reconfigured GPU, every form it now shows —
        through this ledger or (`replica`) the other replica, with no read between."""
        host = self.host(h)
        pool_id = host.pool_id
        via = self.replica if replica else None
        if change == "maintenance":
            self.run(self._maintenance(host.node_id, True))
        elif change == "pool move":
            self.run(self._pool_move(host))  # the pool it leaves: `pool_id`
        elif change == "reconfigure":
            gpus = [g for g in host.gpus if g.present]
            if gpus:
                gpu = gpus[count % len(gpus)]
                self._reform(gpu, count)
                self.run(self._inventory(host))
                self.run(self._book_forms(host, gpu, 3, spot=False, later=None, straight=True))
                self.count("straight after reconfigure")
                return
        tenant = 0 if pool_id != self.pools[0] else count % 2
        body = create_body(
            self.tenants[tenant], pool_id, f"k{next(self.keys)}", shape, count,
            start=None, duration="1h", spot=False, lease_seconds=None, resources=None,
        )  # fmt: skip
        self.run(self._create(body, shape, straight=True, via=via))
        self.count(f"straight after {change}{' (replica)' if replica else ''}")

    def _reform(self, gpu: SimGpu, n: int) -> None:
        """Give `gpu` another form than it has (a new one every time for MIG)."""
        forms = [f for f in GPU_FORMS if f != (gpu.mode, gpu.parts)]
        gpu.mode, gpu.parts = forms[n % len(forms)]
        gpu.generation += 1
