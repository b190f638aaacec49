"""Promise against use end to end (SPEC §10): use reports and heartbeat deltas published
on a real nats-server reach the coordinator, which asks for a full report when a delta
does not apply, and every use kind — `gpu.unbookedUse`, `gpu.foreignUse`,
`reservation.idle`, `reservation.inUse` — reaches a NATS subscriber; the node events,
`usage.report` (used and weighted beside booked) and the metrics say the same."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.app import Coordinator
from shared.clock import FakeClock
from shared.wire import USE_KINDS, DeviceUse, ProcessUse, UseReport
from tests.factories import make_inventory
from tests.integration.coordinator.services.use_agent import (
    IDLE_AFTER_S,
    Agent,
    book_gpus,
    gpu,
    metrics,
    on_the_bus,
    samples,
    unit,
    use_passes,
)
from tests.waiting import eventually


def _series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A /metrics page's values by name and labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples(text)}


def _labels(base: dict[str, str], **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((base | more).items()))


async def test_every_use_kind_reaches_a_nats_subscriber_and_the_ledger_accounts_it(
    used: Coordinator, clock: FakeClock
) -> None:
    async with on_the_bus(used) as (nc, session, api, key):
        await api.ok("tenants.create", {"tenantId": "acme"})
        pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "a"}))["poolId"]
        inv = make_inventory("n1", pool, gpus=3)
        agent = Agent(used, nc, inv)
        subjects = agent.subjects
        await nc.subscribe(subjects.all_alerts, cb=agent.on_alert)
        await nc.subscribe(subjects.use_request(pool, "n1"), cb=agent.on_request)
        # Before the node is known its report is dropped; a report out of its bounds too.
        early = UseReport(node_id="n1", pool_id=pool, boot_id="boot-1", sent_at=0, use_version=1)
        await nc.publish(subjects.use(pool, "n1"), early.to_json())
        await nc.publish(
            subjects.use(pool, "n1"), early.to_json().replace(b'"useVersion":1', b'"useVersion":-1')
        )

        async def dropped() -> bool:
            d = used.ingest.dropped
            return d["unknown_node"] == 1 and d["bad_schema"] == 1

        await eventually(dropped)
        await nc.publish(subjects.inventory(pool, "n1"), inv.to_json())
        await agent.wait_for("node.registered")
        await agent.beat()

        def booking(key: str) -> dict[str, object]:
            return {
                "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
                "duration": "2h", "idempotencyKey": key,
            }  # fmt: skip

        r1 = await api.ok("reservations.create", booking("r1"))
        r2 = await api.ok("reservations.create", booking("r2"))
        g1, g2 = unit(r1), unit(r2)
        (free,) = {f"GPU-n1-{i}" for i in range(3)} - {g1, g2}
        rid1, rid2 = str(r1["reservationId"]), str(r2["reservationId"])

        # A delta on a version the coordinator does not hold: it asks for the report.
        await agent.delta(gpu(g1, (rid1, "reservation")), base=41)

        async def asked() -> bool:
            return agent.requests >= 1

        await eventually(asked)
        # The full report: r1 works on its GPU, a pod runs on the GPU nobody booked.
        await agent.report(gpu(g1, (rid1, "reservation")), gpu(free, ("pod-7", "pod")), gpu(g2))
        (unbooked,) = await agent.wait_for("gpu.unbookedUse")
        assert (unbooked.device_id, unbooked.node_id, unbooked.pool_id) == (free, "n1", pool)
        assert unbooked.details["owners"] == [{"pid": 100, "owner": "pod-7", "ownerKind": "pod"}]

        # r2's process on r1's GPU, as a delta on the version held.
        await agent.delta(gpu(g1, (rid1, "reservation"), (rid2, "reservation")))
        (foreign,) = await agent.wait_for("gpu.foreignUse")
        assert (foreign.device_id, foreign.reservation_id) == (g1, rid2)
        assert foreign.details["holders"] == [rid1] and foreign.details["otherTenant"] is False

        # r2's own GPU stays idle: said once the idle time has passed (heartbeats keep
        # the node reachable meanwhile), and in use again when a process works there.
        for _ in range(IDLE_AFTER_S // 2 + 1):
            clock.advance(2000)
            await agent.beat_same_use()
        (idle,) = await agent.wait_for("reservation.idle")
        assert (idle.reservation_id, idle.details["tenantId"]) == (rid2, "acme")
        # While it lasts the metrics say it too (the shipped rule fires on it).
        idle_series = ("reservation", rid2), ("tenant", "acme"), ("pool", pool), ("node", "n1")
        scraped = _series(await metrics(used, session, key))
        since = scraped[("gpufleet_reservation_idle_since_seconds", tuple(sorted(idle_series)))]
        assert since == idle.details["idleSince"] / 1000
        await agent.delta(gpu(g2, (rid2, "reservation"), util=90))

        async def in_use_again() -> bool:
            # The agent's heartbeats go on meanwhile, as a real agent's do.
            if not any(a.kind == "reservation.inUse" for a in agent.alerts):
                clock.advance(2000)
                await agent.beat_same_use()
                await asyncio.sleep(0.2)
            return any(a.kind == "reservation.inUse" for a in agent.alerts)

        await eventually(in_use_again, within_s=30)
        (back,) = await agent.wait_for("reservation.inUse")
        assert back.reservation_id == rid2
        assert all(
            a.reservation_id != rid1 for a in agent.alerts if a.kind.startswith("reservation.")
        )

        events = await used.ledger.catalog.events("n1")
        assert [(e.kind, e.device_id) for e in events if e.kind.startswith("gpu.")] == [
            ("gpu.unbookedUse", free), ("gpu.foreignUse", g1),
        ]  # fmt: skip

        # What the ledger accounts: r1 used its GPU the whole time at 80 %, r2 only at
        # the end; the pod's GPU was used unbooked.
        clock.advance(2000)
        await agent.beat_same_use()
        await use_passes(used)
        report = await api.ok("usage.report", {"byReservation": True})
        rows = {r["reservationId"]: r for r in report["byReservation"]}
        assert set(rows) == {rid1, rid2}
        for r in rows.values():
            assert 0 <= r["weightedHours"] <= r["usedHours"] <= r["hours"]
        assert rows[rid1]["usedHours"] > rows[rid2]["usedHours"]
        assert rows[rid1]["weightedHours"] == pytest.approx(0.8 * rows[rid1]["usedHours"], rel=0.01)
        (row,) = [r for r in report["rows"] if r["resource"] == "gpu"]
        assert row["usedHours"] == pytest.approx(
            rows[rid1]["usedHours"] + rows[rid2]["usedHours"], abs=1e-5
        )
        assert 0 < row["efficiency"] <= 1
        assert [u["poolId"] for u in report["unbooked"]] == [pool]
        assert report["unbooked"][0]["usedHours"] > 0
        tenant_view = await api.ok("usage.report", {"tenantId": "acme"})
        assert tenant_view["unbooked"] == [] and tenant_view["byReservation"] == []

        # nodes.get (the console's node view): what runs on each GPU and whose it is.
        node = await api.ok("nodes.get", {"nodeId": "n1"})
        uses = {a["deviceId"]: a.get("use") for a in node["atoms"] if a["class"] == "gpu"}
        assert uses[g1] is not None and uses[g1]["inUse"] and uses[g1]["smUtil"] == 80
        assert [(u["owner"], u["ownerKind"]) for u in uses[g1]["users"]] == [
            (rid1, "reservation"), (rid2, "reservation"),
        ]  # fmt: skip
        assert uses[free] is not None and uses[free]["users"][0]["owner"] == "pod-7"
        tenant_key = (await api.ok("apiKeys.create", {"tenantId": "acme"}))["key"]
        seen = await api.ok("nodes.get", {"tenantId": "acme", "nodeId": "n1"}, key=tenant_key)
        by_tenant = {a["deviceId"]: a.get("use") for a in seen["atoms"] if a["class"] == "gpu"}
        # Its own GPU's users, but not who runs on the GPU nobody booked.
        assert len(by_tenant[g1]["users"]) == 2
        assert by_tenant[free]["processes"] == 1 and by_tenant[free]["users"] == []

        # The metrics: who holds and who uses each GPU, by UUID.
        series = _series(await metrics(used, session, key))
        base = {"node": "n1", "pool": pool}
        assert series[("gpufleet_gpu_in_use", _labels(base, UUID=free))] == 1
        foreign_user = _labels(
            base, UUID=g1, reservation=rid1, user=rid2, user_kind="reservation", user_name="",
            match="foreign",
        )  # fmt: skip
        assert series[("gpufleet_gpu_user_info", foreign_user)] == 1
        pod = _labels(
            base, UUID=free, reservation="", user="pod-7", user_kind="pod", user_name="",
            match="unbooked",
        )  # fmt: skip
        assert series[("gpufleet_gpu_user_info", pod)] == 1
        # r2 works again: no longer idle.
        assert not any(name == "gpufleet_reservation_idle_since_seconds" for name, _ in series)

        # Use is a condition (issue 34): the pod stops and r2 leaves r1's GPU; each
        # ends once, with the labels it started with.
        await agent.report(
            gpu(g1, (rid1, "reservation")), gpu(free), gpu(g2, (rid2, "reservation"))
        )
        (ended,) = await agent.wait_for("gpu.unbookedUseEnded")
        assert (ended.device_id, ended.node_id, ended.pool_id) == (free, "n1", pool)
        # Each names its pool by name too (to route on): the start and its end.
        assert unbooked.details["poolName"] == ended.details["poolName"] == "a"
        # A start names its end: a subscriber tells it from an older one-shot event.
        assert unbooked.details["ends"] == "gpu.unbookedUseEnded"
        assert foreign.details["ends"] == "gpu.foreignUseEnded"
        (gone,) = await agent.wait_for("gpu.foreignUseEnded")
        assert (gone.device_id, gone.reservation_id) == (g1, rid2)
        assert gone.details["ownerKind"] == "reservation"
        assert {a.kind for a in agent.alerts} >= set(USE_KINDS)
        events = await used.ledger.catalog.events("n1")
        assert [(e.kind, e.device_id) for e in events if e.kind.startswith("gpu.")] == [
            ("gpu.unbookedUse", free), ("gpu.foreignUse", g1),
            ("gpu.unbookedUseEnded", free), ("gpu.foreignUseEnded", g1),
        ]  # fmt: skip
        assert await used.ledger.gpu_use.conditions() == []


async def test_a_pod_or_a_job_on_a_booked_gpu_is_foreign_and_the_holder_s_own_is_not(
    used: Coordinator,
) -> None:
    """The usual intruder — a pod or a Slurm job a scheduler put on a booked GPU — names
    no reservation: it is said as `gpu.foreignUse` (once while it lasts), as is a process
    nobody owns; a job that carries the booking's `GPUFLEET_RESERVATION_ID` (the
    TaskProlog's export) is the holder's and is not."""
    async with on_the_bus(used) as (nc, session, api, key):
        agent = await Agent.registered(used, nc, api, gpus=2)
        pool = agent.inv.pool_id
        r = await book_gpus(api, pool, 2)
        rid = str(r["reservationId"])
        g0, g1 = sorted(str(a["atomId"]).split(":gpu:", 1)[1] for a in r["atoms"])
        own = (rid, "reservation")
        await agent.report(gpu(g0, own, ("pod-7", "pod")), gpu(g1, own, ("", "unknown")))
        said = await agent.wait_for("gpu.foreignUse", 2)
        await agent.delta(gpu(g0, own, ("pod-7", "pod"), ("42", "slurm")), gpu(g1, own))
        said = await agent.wait_for("gpu.foreignUse", 3)
        by_owner = {(a.details["ownerKind"], a.details["owner"]): a for a in said}
        assert set(by_owner) == {("pod", "pod-7"), ("unknown", ""), ("slurm", "42")}
        pod = by_owner[("pod", "pod-7")]
        assert (pod.device_id, pod.reservation_id, pod.node_id) == (g0, None, "n1")
        assert pod.details["holders"] == [rid] and pod.details["otherTenant"] is None
        assert by_owner[("unknown", "")].device_id == g1
        assert by_owner[("slurm", "42")].details["pids"] == [102]
        events = await used.ledger.catalog.events("n1")
        assert sorted(e.device_id or "" for e in events if e.kind == "gpu.foreignUse") == [
            g0, g0, g1,
        ]  # fmt: skip
        # A few more passes: nothing said again while the same owners run.
        for _ in range(3):
            await agent.beat_same_use()
            await asyncio.sleep(0.1)
        assert sum(a.kind == "gpu.foreignUse" for a in agent.alerts) == 3
        # The metrics say the same: the pod is foreign on the GPU it does not hold.
        matches = {
            (s.labels["user_kind"], s.labels["user"]): s.labels["match"]
            for s in samples(await metrics(used, session, key))
            if s.name == "gpufleet_gpu_user_info" and s.labels["UUID"] == g0
        }
        assert matches == {
            ("reservation", rid): "holder", ("pod", "pod-7"): "foreign", ("slurm", "42"): "foreign",
        }  # fmt: skip
        # The nobody-owned process left g1 at the delta: ended, once. The pod and the job
        # stop: each ends once.
        (nobody,) = await agent.wait_for("gpu.foreignUseEnded")
        assert (nobody.device_id, nobody.details["ownerKind"]) == (g1, "unknown")
        await agent.delta(gpu(g0, own), gpu(g1, own))
        ended = await agent.wait_for("gpu.foreignUseEnded", 3)
        assert {(a.details["ownerKind"], a.details["owner"]) for a in ended} == {
            ("unknown", ""), ("pod", "pod-7"), ("slurm", "42"),
        }  # fmt: skip
        for _ in range(3):
            await agent.beat_same_use()
            await asyncio.sleep(0.1)
        assert [a.kind for a in agent.alerts].count("gpu.foreignUseEnded") == 3


async def test_the_user_series_name_each_owner_once(used: Coordinator) -> None:
    """`gpufleet_gpu_user_info` says who runs on a GPU by name too (`user_name`: a pod's
    namespace/name, a job's user, a container's name, as `nodes.get` gives `ownerName`),
    still one series per owner: two processes of one pod, one of them unnamed, are one
    series with the pod's name."""
    async with on_the_bus(used) as (nc, session, api, key):
        agent = await Agent.registered(used, nc, api, gpus=1)
        procs = (
            ProcessUse(pid=1, owner="pod-7", owner_kind="pod", owner_name="ml/train-0"),
            ProcessUse(pid=2, owner="pod-7", owner_kind="pod"),
            ProcessUse(pid=3, owner="c0ffee", owner_kind="container", owner_name="web-1"),
            ProcessUse(pid=4, owner="42", owner_kind="slurm", owner_name="alice"),
        )
        await agent.report(DeviceUse(device_id="GPU-n1-0", sm_util=60, processes=procs))
        await agent.wait_for("gpu.unbookedUse")
        users = {
            (s.labels["user_kind"], s.labels["user"], s.labels["user_name"]): s.labels["match"]
            for s in samples(await metrics(used, session, key))
            if s.name == "gpufleet_gpu_user_info" and s.labels["UUID"] == "GPU-n1-0"
        }
        assert users == {
            ("pod", "pod-7", "ml/train-0"): "unbooked",
            ("container", "c0ffee", "web-1"): "unbooked",
            ("slurm", "42", "alice"): "unbooked",
        }
