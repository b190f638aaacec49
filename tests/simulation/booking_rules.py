"""The simulation's booking rules: creates of every shape (whole devices, MIG, slots,
VFs, disks, nodes, gangs, scalars, spot, leases, future starts, waits), creates pinned to
one device's forms, replays, interval reservations, renews, releases and the clock —
each followed by what must hold right after it (no promise broken, nothing overcommitted,
only current allocatable atoms booked, preemption notices, the first answer's atRisk)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from coordinator.api.http.render import RESERVATION_ANSWERS, reservation
from coordinator.api.shapes.base import dump
from coordinator.domain.errors import CapacityNotAvailable, InvalidInput, Unavailable
from coordinator.domain.intervals import parse_time
from coordinator.domain.reservation import Reservation
from coordinator.services.idempotent import Replayed
from coordinator.services.intervals import IntervalsBooked, IntervalsRefused
from coordinator.services.reservations import Created, Refused, Reservations, resolve_start
from tests.simulation import reference as ref
from tests.simulation import reference_fit as fit
from tests.simulation.base import (
    DEVICE_INDEX,
    MINUTE,
    NOTICE_MS,
    InvariantViolation,
    MachineBase,
    pick,
)
from tests.simulation.fleet import SimGpu, SimHost, SimNic
from tests.simulation.ledger_view import LedgerView
from tests.simulation.requests import RESOURCES, SHAPES, create_body, create_request, interval_body


class BookingRules(MachineBase):
    # -- bookings ----------------------------------------------------------------------------

    @precondition(lambda self: self.ready)
    @rule(
        shape=st.sampled_from(list(SHAPES)),
        count=st.integers(1, 3),
        tenant=st.integers(0, 1),
        pool=st.integers(0, 1),
        start=st.sampled_from([None, None, None, 10 * MINUTE, 60 * MINUTE, 150 * MINUTE]),
        duration=st.sampled_from(["15m", "1h", "1h", "3h"]),
        spot=st.sampled_from([False, False, False, True]),
        lease=st.sampled_from([None, None, 60, 600]),
        resources=st.sampled_from(RESOURCES),
        wait=st.sampled_from([0] * 7 + [20]),
    )
    def create(
        self,
        shape: str,
        count: int,
        tenant: int,
        pool: int,
        start: int | None,
        duration: str,
        spot: bool,
        lease: int | None,
        resources: dict[str, int] | None,
        wait: int,
    ) -> None:
        tenant_id = self.tenants[tenant]
        pool_id = self.pools[0 if tenant == 1 else pool]  # tenant b sees the offered pool only
        body = create_body(
            tenant_id,
            pool_id,
            f"k{next(self.keys)}",
            shape,
            count,
            start=None if start is None else self.now + start,
            duration=duration,
            spot=spot,
            lease_seconds=lease,
            resources=resources,
            wait_ms=wait,
        )
        self.run(self._create(body, shape))

    @precondition(lambda self: self.ready)
    @rule(
        order=st.tuples(
            st.sampled_from(list(SHAPES)),
            st.integers(1, 2),
            st.integers(0, 1),
            st.sampled_from(["15m", "1h"]),
            st.booleans(),
            st.sampled_from([None, 60]),
        )
    )
    def book(self, order: tuple[str, int, int, str, bool, int | None]) -> None:
        """The common create, drawn as often again (and first: hypothesis favours the
        rules with fewest arguments): now, in the shared pool, no extras."""
        shape, count, tenant, duration, spot, lease = order
        body = create_body(
            self.tenants[tenant],
            self.pools[0],
            f"k{next(self.keys)}",
            shape,
            count,
            start=None,
            duration=duration,
            spot=spot,
            lease_seconds=lease,
            resources=None,
        )
        self.run(self._create(body, shape))

    @precondition(lambda self: self.ready)
    @rule(
        i=DEVICE_INDEX,
        count=st.integers(1, 2),
        spot=st.booleans(),
        later=st.sampled_from([None, 30 * MINUTE]),
    )
    def book_device(self, i: int, count: int, spot: bool, later: int | None) -> None:
        """Book forms of one device (a selector pins it), those under bookings first: a
        device that changed form, or was lost and came back, while its bookings run."""
        host, dev = self.device(i, object)
        if isinstance(dev, SimGpu | SimNic):
            self.run(self._book_forms(host, dev, count, spot=spot, later=later))

    @precondition(lambda self: self.ready)
    @rule(i=st.integers(0, 2) | st.integers(0, 9), count=st.integers(2, 3), spot=st.booleans())
    def book_clique(self, i: int, count: int, spot: bool) -> None:
        """An `nvlink-all` request pinned to one host's whole GPUs (those under bookings
        first): on a chain of bridges a booked middle GPU leaves no pair, and three
        GPUs are never one clique."""
        host = self.host(i)
        uuids = [g.uuid for g in host.gpus if g.present and g.mode == "whole"]
        if len(uuids) < 2:
            return
        body = {
            "tenantId": self.tenants[0],
            "poolId": host.pool_id,
            "duration": "1h",
            "idempotencyKey": f"k{next(self.keys)}",
            "devices": [{"class": "gpu", "count": count, "selector": {"gpuUuid": uuids}}],
            "topology": "nvlink-all",
        } | ({"spot": True} if spot else {})
        self.run(self._create(body, f"clique of {count} on {host.links}"))

    async def _book_forms(
        self,
        host: SimHost,
        dev: SimGpu | SimNic,
        count: int,
        *,
        spot: bool,
        later: int | None,
        straight: bool = False,
    ) -> None:
        entry, forms = host.form(dev)
        body = (
            {
                "tenantId": self.tenants[0],
                "poolId": host.pool_id,
                "duration": "1h",
                "idempotencyKey": f"k{next(self.keys)}",
                "devices": [entry | {"count": min(count, forms)}],
            }
            | ({"spot": True} if spot else {})
            | ({"start": self.now + later} if later else {})
        )
        await self._create(body, f"device {entry['class']}", straight=straight)

    async def _create(
        self,
        body: dict[str, Any],
        shape: str,
        *,
        straight: bool = False,
        via: Reservations | None = None,
    ) -> None:
        """Create `body` through this sequence's ledger (or `via` another replica's
        reservations), after a preview — or `straight`, with no read of the pool in
        between since the last change (issue 31: a create must not need a read before it
        to see what changed)."""
        now = self.now
        request = create_request(body)
        would = False
        if not straight:
            # Preview first: what it says fits, the create at once must book (SPEC §5:
            # nothing changed in between; a quota may still refuse, preview checks none).
            start = resolve_start(request.start, now)
            preview = await self.ledger.bookings.preview(
                request.pool_id, request.placement, start, start + request.duration_ms, now,
                NOTICE_MS,
            )  # fmt: skip
            would = preview.placement.fits or preview.preemptible is not None
        try:
            out = await (via or self.reservations).create(request)
        except Unavailable as exc:
            # One writer, nothing to race: the placer offered what the database refuses.
            raise InvariantViolation(
                f"create {body} answered 503 ({exc}) with no other writer: the placer "
                "offered capacity the database's claims refuse (the same physical device "
                "promised twice)"
            ) from exc
        if isinstance(out, Replayed):
            raise InvariantViolation(f"a fresh key was answered as a replay: {out}")
        if isinstance(out, Refused):
            self.answers.append((body, out.error.status, RESERVATION_ANSWERS.refused(out.error)))
            self.count(f"create refused: {out.error.code}")
            if out.error.code == CapacityNotAvailable.code:
                await self._judge_refusal(body, now, would)
            return
        assert isinstance(out, Created)
        res = out.reservation
        self.answers.append((body, 200, dump(reservation(res, out.at))))
        self.models[res.reservation_id] = self._model(res)
        self.bodies[res.reservation_id] = body
        noticed_before = {
            v.reservation_id: self.models[v.reservation_id].preempt_at for v in out.victims
        }
        for victim in out.victims:
            self.models[victim.reservation_id].preempt_at = victim.preempt_at
        self.count(f"create booked: {shape}" + (" (preempting)" if out.victims else ""))
        view = await self.view()
        self.booked_forms |= fit.forms_at_booking(view, res.reservation_id)
        problems = ref.broken_promises(view, res.reservation_id)
        problems += fit.unlinked(
            view, fit.ask_of(body, now), ((a.node_id, a.atom_id) for a in res.atoms)
        )
        problems += ref.overcommitted(view, res.reservation_id, now)
        problems += self._unbookable(view, res)
        problems += self._notices(out, now, noticed_before)
        problems += self._born_at_risk(view, res, now)
        self.fail(problems, f"create {body}")

    async def _judge_refusal(self, body: dict[str, Any], now: int, would: bool) -> None:
        """A CAPACITY_NOT_AVAILABLE must be one the reference shares — it fits neither
        as the pool is nor with every spot holder preempted — and one preview did not
        promise (nothing changed in between: a refusal changes nothing)."""
        ask = fit.ask_of(body, now)
        view = await self.view()
        verdict = fit.verdict(view, ask, self.racks, self.booked_forms, now, NOTICE_MS)
        self.count(f"refusal judged: {verdict}" + (" (nvlink)" if ask.nvlink else ""))
        problems = (
            [f"refused CAPACITY_NOT_AVAILABLE, but it {verdict}: {ask}"]
            if verdict in (fit.FITS, fit.PREEMPTING)
            else []
        )
        if would:
            problems.append("refused CAPACITY_NOT_AVAILABLE, but preview said it fits")
        self.fail(problems, f"create {body}")

    def _born_at_risk(self, view: LedgerView, res: Reservation, now: int) -> list[str]:
        """A booking is at risk from its first answer when it took faulty devices (whole
        nodes keep theirs); no alert, nothing changed for it."""
        risky, unsaid = ref.at_risk_atoms(view, self.models[res.reservation_id])
        self.at_risk[res.reservation_id] = bool(risky)
        flag = dump(reservation(res, now)).get("atRisk")
        got = sorted(flag["atoms"]) if flag else []
        if unsaid or got == sorted(risky):
            return []
        return [f"{res.reservation_id} answered atRisk {flag}, atoms at risk {sorted(risky)}"]

    def _model(self, res: Reservation) -> ref.ReservationModel:
        return ref.ReservationModel(
            reservation_id=res.reservation_id,
            tenant_id=res.tenant_id,
            pool_id=res.pool_id,
            start=res.start,
            end=res.end,
            atoms=tuple(a.atom_id for a in res.atoms),
            lease_seconds=res.lease_seconds,
            lease_expires_at=res.lease_expires_at,
        )

    def _unbookable(self, view: LedgerView, res: Reservation) -> list[str]:
        """A new booking takes current atoms of allocatable nodes of its own pool, healthy
        ones unless it takes whole nodes (those keep their faulty devices)."""
        whole = res.binding == "node" or any(a.cls == "node" for a in res.atoms)
        out = []
        for a in res.atoms:
            atom = view.atoms.get(a.atom_id)
            node = view.nodes.get(a.node_id)
            if atom is None or node is None or atom.retired:
                out.append(f"{res.reservation_id} booked {a.atom_id}, not a current atom")
            elif node.pool_id != res.pool_id:
                out.append(f"{res.reservation_id} booked {a.atom_id} of pool {node.pool_id}")
            elif ref.node_bucket(node) != "allocatable":
                out.append(
                    f"{res.reservation_id} booked {a.atom_id} on a node that is "
                    f"{ref.node_bucket(node)}"
                )
            elif not whole and atom.health in ref.FAULTY:
                out.append(f"{res.reservation_id} booked {a.atom_id}, which is {atom.health}")
        return out

    def _notices(self, out: Created, now: int, before: dict[str, int | None]) -> list[str]:
        """Victims are spot holders, noticed now for now + the notice period (or kept to
        an earlier notice they already had), and the new booking starts after."""
        problems = []
        for victim in out.victims:
            want = before.get(victim.reservation_id) or now + NOTICE_MS
            if victim.preempt_at != want or not victim.spot:
                problems.append(
                    f"victim {victim.reservation_id} noticed for "
                    f"{victim.preempt_at}, spot={victim.spot}"
                )
            if out.reservation.start < now + NOTICE_MS:
                problems.append(
                    f"{out.reservation.reservation_id} preempts and starts at "
                    f"{out.reservation.start}, before the notice runs out"
                )
        noticed = {a.reservation_id for a in self.alerts.alerts if a.kind == "reservation.notice"}
        missing = [v.reservation_id for v in out.victims if v.reservation_id not in noticed]
        if missing:
            problems.append(f"victims {missing} got no reservation.notice")
        return problems

    @precondition(lambda self: self.ready and bool(self.answers))
    @rule(i=st.integers(0, 99))
    def replay_create(self, i: int) -> None:
        body, status, answer = pick(self.answers, i)
        out = self.run(self.reservations.create(create_request(body)))
        if not isinstance(out, Replayed) or (out.status, out.body) != (status, answer):
            raise InvariantViolation(f"replay of {body} answered {out}, first {status} {answer}")
        self.count("create replayed")

    @precondition(lambda self: self.ready)
    @rule(
        tenant=st.integers(0, 1),
        pool=st.integers(0, 1),
        first=st.integers(0, 10),
        count=st.integers(1, 4),
        gb=st.sampled_from([4, 8, 16, 32, 48, 64]),
    )
    def book_intervals(self, tenant: int, pool: int, first: int, count: int, gb: int) -> None:
        tenant_id = self.tenants[tenant]
        pool_id = self.pools[0 if tenant == 1 else pool]
        body = interval_body(self.now, first, count, gb)
        self.run(self._intervals(tenant_id, body, pool_id))

    async def _intervals(self, tenant_id: str, body: dict[str, Any], pool_id: str) -> None:
        out = await self.intervals.book(tenant_id, body, pool_id, f"i{next(self.keys)}")
        if isinstance(out, IntervalsRefused):
            self.count("intervals refused")
            await self._judge_interval_refusal(tenant_id, body, pool_id, out)
            return
        assert isinstance(out, IntervalsBooked), out
        self.count("intervals booked")
        view = await self.view()
        self.fail(
            ref.overcommitted(view, out.reservation.reservation_id, self.now),
            f"interval booking {body} in {pool_id}",
        )

    async def _judge_interval_refusal(
        self, tenant_id: str, body: dict[str, Any], pool_id: str, out: IntervalsRefused
    ) -> None:
        """An `insufficient_capacity` must be one the reference shares: some quarter asks
        more than the pool's memory and the tenant's quotas surely leave."""
        if any(s.reason != "insufficient_capacity" for s in out.shortfalls):
            raise InvariantViolation(f"interval booking {body} raced with no other writer: {out}")
        view = await self.view()
        quarters = [
            (
                parse_time(iv["startsAt"], "startsAt"),
                parse_time(iv["endsAt"], "endsAt"),
                iv["capacityGb"],
            )
            for iv in body["intervals"]
        ]
        rooms = [fit.interval_room(view, tenant_id, pool_id, s, e) for s, e, _ in quarters]
        self.fail(
            []
            if any(gb > room for (_, _, gb), room in zip(quarters, rooms, strict=True))
            else [f"refused insufficient_capacity, each quarter fits (rooms {rooms}): {out}"],
            f"interval booking {body} in {pool_id}",
        )

    @precondition(lambda self: self.ready and bool(self.models))
    @rule(i=st.integers(0, 99), seconds=st.sampled_from([None, 60, 600]))
    def renew(self, i: int, seconds: int | None) -> None:
        # Leased reservations first, live ones before ended ones.
        leased = sorted(
            self.models.values(),
            key=lambda m: (m.lease_seconds is None, not m.live(self.now, self.ticks)),
        )
        m = pick(leased, i)
        self.run(self._renew(m, seconds))

    async def _renew(self, m: ref.ReservationModel, seconds: int | None) -> None:
        now = self.now
        renewable = m.lease_seconds is not None and m.live(now, self.ticks)
        try:
            out = await self.reservations.renew(m.tenant_id, m.reservation_id, seconds)
        except InvalidInput:
            if renewable:
                raise InvariantViolation(f"renew of live leased {m} refused at {now}") from None
            self.count("renew refused")
            return
        if not renewable:
            raise InvariantViolation(f"renew of {m} answered {out} at {now}")
        m.lease_seconds = seconds or m.lease_seconds
        assert m.lease_seconds is not None
        m.lease_expires_at = now + m.lease_seconds * 1000
        stored = await self.ledger.reservations.get(m.reservation_id, m.tenant_id)
        if (out.reservation.lease_expires_at, stored.lease_expires_at) != (m.lease_expires_at,) * 2:
            raise InvariantViolation(
                f"renew answered lease {out.reservation.lease_expires_at}, stored "
                f"{stored.lease_expires_at}, expected {m.lease_expires_at}"
            )
        self.count("renewed")

    @precondition(lambda self: self.ready and bool(self.models))
    @rule(i=st.integers(0, 99))
    def release(self, i: int) -> None:
        m = pick(list(self.models.values()), i)
        self.run(self._release(m))

    async def _release(self, m: ref.ReservationModel) -> None:
        now = self.now
        was_live = m.live(now, self.ticks)
        out = await self.reservations.release(m.tenant_id, m.reservation_id)
        state = out.reservation.state(now)
        if was_live:
            m.released_at = now
        if state not in m.states(now, self.ticks):
            raise InvariantViolation(f"release of {m} answered {state!r} at {now}")
        self.count("released" if was_live else "release of an ended reservation")

    @precondition(lambda self: self.ready and bool(self.models))
    @rule(i=st.integers(0, 99), same_gpus=st.booleans())
    def release_and_rebook(self, i: int, same_gpus: bool) -> None:
        """A tenant releases a reservation and at once asks for the same again (a new key,
        the same start while it is still ahead, else from now) — with `same_gpus`, for the
        very GPUs it held (a selector pins them): what the release freed counts as free
        at once, so a refusal of it is judged like any other (issue 23, free counts kept
        over a reload; a released booking that had not started is gone, not ended, so
        its node's kept count is used as it stands)."""
        live = [m for m in self.models.values() if m.live(self.now, self.ticks)]
        m = pick(live or list(self.models.values()), i)
        body = self.bodies[m.reservation_id]
        ahead = isinstance(body.get("start"), int) and body["start"] > self.now
        again = {k: v for k, v in body.items() if k != "wait" and (k != "start" or ahead)}
        if same_gpus:
            again = _pinned_to_gpus(again, self.run(self.view()), m.atoms)
        self.run(self._release(m))
        self.run(self._create(again | {"idempotencyKey": f"k{next(self.keys)}"}, "rebooked"))

    # -- time -----------------------------------------------------------------------------------

    @precondition(lambda self: self.ready)
    @rule(
        ms=st.sampled_from(
            # Past a 60 s lease and a 120 s notice first, then short and long moves.
            [61_000, 121_000, 1_000, 30_000, 5 * MINUTE, 15 * MINUTE, 60 * MINUTE, 180 * MINUTE]
        )
    )
    def time_passes(self, ms: int) -> None:
        self.clock.advance(ms)
        self.run(self.res_clock.tick())
        self.ticks.append(self.now)
        self.count("clock advanced")


def _pinned_to_gpus(
    body: dict[str, Any], view: LedgerView, atoms: tuple[str, ...]
) -> dict[str, Any]:
    """`body` with each GPU device entry pinned to the GPUs of `atoms` (unchanged when
    it asks for anything else)."""
    found = [view.atoms[a].attrs.get("gpuUuid") if a in view.atoms else None for a in atoms]
    entries = body.get("devices") or []
    if not found or None in found or any(not str(d["class"]).startswith("gpu") for d in entries):
        return body
    pinned = [d | {"selector": {"gpuUuid": sorted(set(map(str, found)))}} for d in entries]
    return body | {"devices": pinned}
