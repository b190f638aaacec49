"""The simulation's fleet rules: nodes added, devices reconfigured (MIG, time-slice,
VFs), lost and back, health and reachability, maintenance, agents restarting together
(the batched inventory path) and pool moves — each followed by what the SPEC says must
hold right after it (`device.reconfigured` recorded, a node without bookings where its
agent says, `nodes.setMaintenance`'s count of reservations it put at risk)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from coordinator.ledger import ReservationFilter
from coordinator.services.node_records import (
    record_reachability,
)
from tests.simulation.base import (
    DEVICE_INDEX,
    GPU_FORMS,
    MAX_HOSTS,
    MachineBase,
    device_id_of,
    pick,
)
from tests.simulation.fleet import Health, Links, SimGpu, SimHost, SimNic
from tests.simulation.requests import interval_body


class FleetRules(MachineBase):
    @precondition(lambda self: self.ready and len(self.hosts) < MAX_HOSTS)
    @rule(
        pool=st.integers(0, 1),
        rack=st.sampled_from(["r0", "r1"]),
        gpus=st.integers(1, 3),
        nics=st.integers(0, 1),
        links=st.sampled_from(["chain", "all"]),
    )
    def add_node(self, pool: int, rack: str, gpus: int, nics: int, links: Links) -> None:
        host = SimHost.build(
            f"{self.ns}-n{len(self.hosts)}", self.pools[pool], rack, gpus, nics, links
        )
        self.run(self._register(host))
        self.count("node added")

    @precondition(lambda self: self.ready)
    @rule(i=DEVICE_INDEX, form=st.integers(0, 5), then_book=st.sampled_from([True, False]))
    def reconfigure(self, i: int, form: int, then_book: bool) -> None:
        """Change a device's form: a GPU to MIG (2 or 3 instances, new ones every time),
        time-slice slots (2, 4 or 1 replicas, the same ids for the same slots) or whole; a
        NIC to 0-3 VFs. With `then_book` a tenant at once asks for every form the device
        now shows — which must not be free where its old forms are still booked."""
        host, dev = self.device(i, object)
        before = _forms(host, device_id_of(dev))
        if isinstance(dev, SimGpu):
            dev.mode, dev.parts = GPU_FORMS[form]
            dev.generation += 1
            self.count(f"gpu reconfigured to {dev.mode}")
        elif isinstance(dev, SimNic):
            dev.vfs = form % 4
            self.count("nic reconfigured")
        else:
            return
        changed = _forms(host, device_id_of(dev)) != before
        self.run(self._reconfigured(host, dev, then_book, changed))

    async def _reconfigured(
        self, host: SimHost, dev: SimGpu | SimNic, then_book: bool, changed: bool
    ) -> None:
        """`changed`: the device reports other forms than before (not the same form
        again, not a device the agent has lost)."""
        device = device_id_of(dev)
        live = (host.node_id, device) in (await self._held_devices())[1]
        await self._inventory(host)
        if then_book:
            await self._book_forms(host, dev, 3, spot=False, later=None)
        if live and changed:
            events = [
                e
                for e in (await self.view()).events
                if e.kind == "device.reconfigured" and e.device_id == device and e.at == self.now
            ]
            self.fail(
                []
                if events
                else [
                    f"{device} on {host.node_id} changed form under live "
                    "bookings and no device.reconfigured event was recorded"
                ],
                "reconfiguration",
            )

    @precondition(lambda self: self.ready)
    @rule(i=DEVICE_INDEX)
    def lose_or_restore_device(self, i: int) -> None:
        host, dev = self.device(i, object)
        dev.present = not dev.present  # type: ignore[attr-defined]
        self.run(self._inventory(host))
        self.count("device lost" if not dev.present else "device back")  # type: ignore[attr-defined]

    @precondition(lambda self: self.ready)
    @rule(
        i=DEVICE_INDEX,
        status=st.sampled_from(["unhealthy", "healthy", "degraded", "unmonitored"]),
        by_inventory=st.booleans(),
    )
    def device_health(self, i: int, status: Health, by_inventory: bool) -> None:
        host, dev = self.device(i, object)
        dev.health = status  # type: ignore[attr-defined]
        self.run(self._inventory(host) if by_inventory else self._heartbeat(host))
        self.count(f"device {status}")

    @precondition(lambda self: self.ready)
    @rule(
        h=st.integers(0, 9),
        status=st.sampled_from(["healthy", "unhealthy", "degraded", "unmonitored"]),
        provisioning=st.sampled_from([False, False, False, True]),
    )
    def node_health(self, h: int, status: Health, provisioning: bool) -> None:
        host = self.host(h)
        host.health, host.provisioning = status, provisioning
        self.run(self._heartbeat(host))
        self.count(f"node {status}" + (" provisioning" if provisioning else ""))

    @precondition(lambda self: self.ready)
    @rule(h=st.integers(0, 9), reachable=st.sampled_from([False, True]))
    def reachability(self, h: int, reachable: bool) -> None:
        host = self.host(h)
        self.run(self._reachability(host.node_id, reachable))
        self.count("reachable" if reachable else "unreachable")

    async def _reachability(self, node_id: str, reachable: bool) -> None:
        await self._publish(await record_reachability(self.ledger, [node_id], reachable, self.now))

    @precondition(lambda self: self.ready)
    @rule(h=st.integers(0, 9), on=st.sampled_from([True, False]))
    def maintenance_change(self, h: int, on: bool) -> None:
        host = self.host(h)
        self.run(self._maintenance(host.node_id, on))
        self.count("maintenance on" if on else "maintenance off")

    async def _maintenance(self, node_id: str, on: bool) -> None:
        """`nodes.setMaintenance` answers with the number of reservations it put at risk:
        those whose flag it switched on."""
        before = await self._flagged()
        out = await self.maintenance.set(node_id, on, "simulated work", "operator/sim")
        after = await self._flagged()
        put = len(after - before)
        self.fail(
            []
            if out.reservations_at_risk == put
            else [
                f"maintenance {on} on {node_id} answered {out.reservations_at_risk} put at "
                f"risk, {put} reservations were ({sorted(after - before)})"
            ],
            "maintenance",
        )

    async def _flagged(self) -> set[str]:
        """Our reservations that carry an `atRisk` flag now: compute ones, and interval
        ones with a quarter still to run (`nodes.setMaintenance` counts both)."""
        now, out = self.now, set()
        for tenant_id in self.tenants:
            page = await self.ledger.listing.page(ReservationFilter(tenant_id), None, 1000, now)
            out |= {r.reservation_id for r in page if r.live(now) and r.at_risk is not None}
            intervals = await self.ledger.intervals.page(tenant_id, 0, now + 1, None, 1000)
            out |= {
                r.reservation_id
                for r in intervals
                if r.at_risk is not None and any(iv.ends_at > now for iv in r.intervals)
            }
        return out

    @precondition(lambda self: self.ready)
    @rule(h=st.integers(0, 9), move=st.booleans(), new=st.booleans())
    def inventories_batch(self, h: int, move: bool, new: bool) -> None:
        """Agents restarting together: two known nodes (the first maybe into the other
        pool) and, while there is room, a new one, through the batched path."""
        hosts = self._hosts(self.run(self._held_devices())[0])
        batch = [pick(hosts, h), pick(hosts, h + 1)]
        if move:
            batch[0].pool_id = next(p for p in self.pools if p != batch[0].pool_id)
            batch[0].boot += 1
        if new and len(self.hosts) < MAX_HOSTS:
            host = SimHost.build(f"{self.ns}-n{len(self.hosts)}", self.pools[h % 2], "r1", 2, 1)
            self.hosts.append(host)
            batch.append(host)
        self.run(self._inventories(batch))
        self.count("inventories batched" + (" (pool move)" if move else ""))

    @precondition(lambda self: self.ready)
    @rule(h=st.integers(0, 9), promised=st.booleans())
    def pool_move(self, h: int, promised: bool) -> None:
        """A node's agent reports the other pool; with `promised`, its pool's interval
        reservations were just promised as much memory as the node has (issue 31: the
        pool it leaves must not count the node's own memory, so a pool whose other
        nodes cannot cover that keeps it)."""
        host = self.host(h)
        if promised:
            body = interval_body(self.now, 0, 2, host.memory_gib)
            self.run(self._intervals(self.tenants[0], body, host.pool_id))
        self.run(self._pool_move(host))

    async def _pool_move(self, host: SimHost) -> None:
        holding = host.node_id in (await self._held_devices())[0]
        host.pool_id = next(p for p in self.pools if p != host.pool_id)
        host.boot += 1
        await self._inventory(host)
        self.count("pool move (holding bookings)" if holding else "pool move")


def _forms(host: SimHost, device: str) -> set[str]:
    """The atom ids the host reports for one device now."""
    return {a.atom_id for a in host.atoms() if a.device_id == device}
