"""A tenant sees only its own (issue 32): acme's pool offered to globex, one node with a
GPU time-sliced into two slots (one slot each), a GPU acme holds, one acme holds idle
and one nobody holds. Real use passes (`GpuUseWatch.tick`) over the ledger, and every
view read over HTTP, as each tenant and as the operator — one test per view. The
operator sees everything; each tenant its own reservations' details and use only."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from coordinator.api.app import build_app
from coordinator.api.http.alert_feed import AlertFeed
from coordinator.api.http.context import Services
from coordinator.domain.gpu_use_units import Policy
from coordinator.ledger import Ledger
from coordinator.services.gpu_use_watch import GpuUseWatch
from coordinator.services.node_records import record_inventory
from coordinator.wiring.ledger import bootstrap_operator
from ops.kit.keys import new_key
from shared.clock import FakeClock
from shared.subjects import Subjects
from shared.wire import Alert, Atom, DeviceUse, Inventory, ProcessUse, UseReport
from tests.factories import backed, make_inventory
from tests.fakes import RecordingAlerts, RecordingPublisher
from tests.integration.conftest import Api

MIN = 60_000
NODE = "n0"
SLICED, HELD, IDLE, FREE = (f"GPU-{NODE}-{i}" for i in range(4))
# Strings only the operator may read in globex's views.
POD = "pod-7f3e-acme-secret"
UNBOOKED_POD = "pod-91c2-nobody-secret"


class _FeedSink:
    """The alert sink: what the coordinator's bus would put in the console feed."""

    def __init__(self, feed: AlertFeed) -> None:
        self.feed = feed

    async def publish(self, alert: Alert) -> None:
        self.feed.add(alert)


@dataclass
class Shared:
    api: Api
    keys: dict[str, str]
    rsv: dict[str, str]  # acme-slot, globex-slot, acme-held, acme-idle
    ledger: Ledger
    clock: FakeClock
    watch: GpuUseWatch  # the leader's

    async def read(self, method: str, body: dict[str, Any], who: str) -> Any:
        key = self.keys.get(who)
        tenant = {} if who == "operator" else {"tenantId": who}
        return await self.api.ok(method, body | tenant, key)

    async def feed(self, who: str) -> list[dict[str, Any]]:
        key = self.keys.get(who) or self.api.operator_key
        headers = {"Authorization": f"Bearer {key}"}
        async with self.api.session.get(
            f"{self.api.base}/api/console/alerts", headers=headers
        ) as resp:
            assert resp.status == 200
            return list((await resp.json())["alerts"])

    async def idle(self, who: str) -> list[dict[str, Any]]:
        """The console feed's idle reservations (issue 34) as `who` reads them."""
        key = self.keys.get(who) or self.api.operator_key
        headers = {"Authorization": f"Bearer {key}"}
        async with self.api.session.get(
            f"{self.api.base}/api/console/alerts", headers=headers
        ) as resp:
            assert resp.status == 200
            return list((await resp.json())["idle"])


def _inventory(pool: str) -> Inventory:
    """Four GPUs, the first time-sliced into two slots."""
    inv = make_inventory(NODE, pool, gpus=4)
    gpu = next(a for a in inv.atoms if a.device_id == SLICED)
    slots = [
        Atom(atom_id=f"{NODE}:gpu.slot:{SLICED}:{j}", cls="gpu.slot", device_id=SLICED)
        for j in range(2)
    ]
    atoms = (*(a for a in inv.atoms if a != gpu), *slots)
    return backed(
        msgspec.structs.replace(inv, atoms=atoms, inventory_hash=inv.inventory_hash + "-sl")
    )


def _book(tenant: str, pool: str, cls: str, key: str, start: int) -> dict[str, Any]:
    return {
        "tenantId": tenant, "poolId": pool, "devices": [{"class": cls, "count": 1}],
        "start": start, "duration": 3600, "idempotencyKey": key,
    }  # fmt: skip


def _devices(rsv: dict[str, str]) -> tuple[DeviceUse, ...]:
    def own(pid: int, who: str, util: int, mib: int) -> ProcessUse:
        return ProcessUse(
            pid=pid, owner=rsv[who], owner_kind="reservation", sm_util=util, used_memory_mib=mib
        )

    return (
        DeviceUse(device_id=SLICED, sm_util=70, memory_used_mib=3000,
                  processes=(own(11, "acme-slot", 30, 1000), own(22, "globex-slot", 40, 2000))),
        DeviceUse(device_id=HELD, sm_util=90, memory_used_mib=9000,
                  processes=(own(33, "acme-held", 80, 5000), own(44, "globex-slot", 10, 100),
                             ProcessUse(pid=55, owner=POD, owner_kind="pod",
                                        owner_name="ml/train-0"))),
        DeviceUse(device_id=IDLE, sm_util=0, memory_used_mib=0),
        DeviceUse(device_id=FREE, sm_util=60, memory_used_mib=4000,
                  processes=(ProcessUse(pid=66, owner=UNBOOKED_POD, owner_kind="pod"),)),
    )  # fmt: skip


@pytest.fixture
async def shared(database_url: str, clock: FakeClock) -> AsyncIterator[Shared]:
    ledger = await Ledger.open(database_url)
    try:
        operator = new_key()
        await bootstrap_operator(ledger, operator, clock.now_ms())
        feed = AlertFeed()
        watch = GpuUseWatch(
            ledger, Subjects("t"), clock, RecordingPublisher(), _FeedSink(feed),
            reachable=lambda _: True, policy=Policy(idle_after_ms=2 * MIN), flush_ms=0,
        )  # fmt: skip
        services = Services(ledger, clock, RecordingAlerts(), feed=feed, gpu_use=watch.book)
        async with TestClient(TestServer(build_app(services))) as client:
            api = Api(client.session, str(client.make_url("")).rstrip("/"), operator)
            yield await _populate(api, ledger, clock, watch)
    finally:
        await ledger.close()


async def _populate(api: Api, ledger: Ledger, clock: FakeClock, watch: GpuUseWatch) -> Shared:
    for tenant in ("acme", "globex"):
        await api.ok("tenants.create", {"tenantId": tenant})
    pool = (await api.ok("pools.create", {"tenantId": "acme", "name": "shared"}))["poolId"]
    await api.ok("pools.offer", {"tenantId": "acme", "poolId": pool, "offerTo": "globex"})
    inventory = _inventory(pool)
    await record_inventory(ledger, inventory, 1)
    watch.on_inventory(inventory)  # use counts only for the units a node's inventory has
    keys = {t: (await api.ok("apiKeys.create", {"tenantId": t}))["key"] for t in ("acme", "globex")}
    t = clock.now_ms()
    rsv: dict[str, str] = {}
    for name, cls in (("acme-slot", "gpu.slot"), ("globex-slot", "gpu.slot")):
        tenant = name.split("-")[0]
        made = await api.ok("reservations.create", _book(tenant, pool, cls, name, t), keys[tenant])
        rsv[name] = made["reservationId"]
    # The two whole GPUs acme books: which is which is the placer's choice.
    made = [
        await api.ok("reservations.create", _book("acme", pool, "gpu", k, t), keys["acme"])
        for k in ("a1", "a2")
    ]
    by_gpu = {m["atoms"][0]["atomId"].rsplit(":", 1)[-1]: m["reservationId"] for m in made}
    rsv["acme-held"], rsv["acme-idle"] = by_gpu[HELD], by_gpu[IDLE]
    for version in range(1, 5):  # passes a minute apart: acme's idle GPU is said idle
        report = UseReport(
            node_id=NODE, pool_id=pool, boot_id="boot-1", sent_at=0, use_version=version,
            devices=_devices(rsv),
        )  # fmt: skip
        watch.on_report(report)
        await watch.tick()
        clock.advance(MIN)
    return Shared(api, keys, rsv, ledger, clock, watch)


def _text(value: Any) -> str:
    return json.dumps(value)


def _acme_secrets(s: Shared) -> list[str]:
    return [s.rsv["acme-slot"], s.rsv["acme-held"], s.rsv["acme-idle"], POD, '"acme"']


async def test_the_console_feed_shows_a_tenant_only_its_own_reservations_and_use(
    shared: Shared,
) -> None:
    everything = await shared.feed("operator")
    kinds = {a["kind"] for a in everything}
    assert {"gpu.unbookedUse", "gpu.foreignUse", "reservation.idle"} <= kinds
    seen = [shared.rsv["acme-held"], shared.rsv["acme-idle"], POD, UNBOOKED_POD, '"acme"']
    assert all(x in _text(everything) for x in seen)

    globex = await shared.feed("globex")
    text = _text(globex)
    for secret in [*_acme_secrets(shared), UNBOOKED_POD, '"pids"']:
        assert secret not in text, secret
    assert all(a["kind"] != "reservation.idle" for a in globex)
    # Its own process on acme's GPU: it learns that much, not whose GPU it is.
    (foreign,) = [a for a in globex if a["kind"] == "gpu.foreignUse"]
    assert foreign["reservationId"] == shared.rsv["globex-slot"]
    assert foreign["details"]["holders"] == []
    assert "another tenant" in foreign["reason"]
    (unbooked,) = [a for a in globex if a["kind"] == "gpu.unbookedUse"]
    assert unbooked["details"] == {"processes": 1}

    acme = await shared.feed("acme")
    acme_text = _text(acme)
    assert shared.rsv["globex-slot"] not in acme_text and '"globex"' not in acme_text
    assert [a["reservationId"] for a in acme if a["kind"] == "reservation.idle"] == [
        shared.rsv["acme-idle"]
    ]
    on_held = [a for a in acme if a["kind"] == "gpu.foreignUse"]
    assert sorted(a["details"]["ownerKind"] for a in on_held) == ["pod", "reservation"]
    assert all(a["details"]["holders"] == [shared.rsv["acme-held"]] for a in on_held)


async def test_the_console_counts_idle_bookings_of_the_viewer_only(shared: Shared) -> None:
    """The fleet cards' idle count (issue 34) comes from the feed's `idle`: acme's idle
    booking for acme and the operator, nothing of it for globex."""
    idle = shared.rsv["acme-idle"]
    for who in ("operator", "acme"):
        rows = await shared.idle(who)
        assert [r["reservationId"] for r in rows] == [idle], who
        assert rows[0]["poolId"] and isinstance(rows[0]["idleSince"], int)
    assert await shared.idle("globex") == []


async def test_node_events_name_no_reservation_or_owner_to_a_tenant(shared: Shared) -> None:
    body = {"nodeId": NODE}
    everything = _text(await shared.read("nodes.events", body, "operator"))
    assert shared.rsv["acme-held"] in everything and shared.rsv["globex-slot"] in everything
    for who, other in (("globex", "acme-held"), ("acme", "globex-slot")):
        events = (await shared.read("nodes.events", body, who))["events"]
        assert {"gpu.foreignUse", "gpu.unbookedUse"} <= {e["kind"] for e in events}
        assert shared.rsv[other] not in _text(events), who


def _use(node: dict[str, Any], atom_id: str) -> dict[str, Any]:
    return dict(next(a for a in node["atoms"] if a["atomId"] == atom_id)["use"])


async def test_node_and_slot_views_show_a_tenant_its_own_use_only(shared: Shared) -> None:
    body = {"nodeId": NODE}
    slot = f"{NODE}:gpu.slot:{SLICED}:0"
    held, free = f"{NODE}:gpu:{HELD}", f"{NODE}:gpu:{FREE}"
    operator = await shared.read("nodes.get", body, "operator")
    assert {u["pid"] for u in _use(operator, slot)["users"]} == {11, 22}
    assert _use(operator, held)["smUtil"] == 90 and _use(operator, held)["processes"] == 3
    # Owners by kind and, where the agent read one, name (issue 34); none: no key.
    assert [u for u in _use(operator, held)["users"] if u["pid"] == 55] == [
        {"pid": 55, "owner": POD, "ownerKind": "pod", "ownerName": "ml/train-0"}
    ]
    assert _use(operator, free)["users"] == [{"pid": 66, "owner": UNBOOKED_POD, "ownerKind": "pod"}]

    # On the shared GPU each slot holder sees its own processes, on either slot's atom.
    for who, pid, util, mib in (("acme", 11, 30, 1000), ("globex", 22, 40, 2000)):
        node = await shared.read("nodes.get", body, who)
        for j in range(2):
            seen = _use(node, f"{NODE}:gpu.slot:{SLICED}:{j}")
            assert [u["pid"] for u in seen["users"]] == [pid], who
            assert (seen["smUtil"], seen["memoryUsedMib"], seen["processes"]) == (util, mib, 1)
    # acme holds that GPU alone: everything on it, the strangers included.
    acme = await shared.read("nodes.get", body, "acme")
    assert {u["pid"] for u in _use(acme, held)["users"]} == {33, 44, 55}
    # To globex, acme's GPU is busy, and no more; the unbooked one runs one process.
    globex = await shared.read("nodes.get", body, "globex")
    for atom, processes in ((held, 0), (free, 1)):
        assert _use(globex, atom) | {"at": 0} == {
            "inUse": True, "smUtil": None, "memoryUsedMib": None, "processes": processes,
            "users": [], "at": 0,
        }  # fmt: skip
    assert all(s not in _text(globex) for s in _acme_secrets(shared) if s != '"acme"')


async def test_the_fleet_gpu_list_discloses_what_nodes_get_does(shared: Shared) -> None:
    """gpus.list (issue 34) shows each viewer each unit's holder and use exactly as
    nodes.get does: a tenant its own processes only, another's holder as held."""
    for who in ("operator", "acme", "globex"):
        node = await shared.read("nodes.get", {"nodeId": NODE}, who)
        atoms = {a["atomId"]: a for a in node["atoms"]}
        units = (await shared.read("gpus.list", {}, who))["gpus"]
        assert len(units) == 5, who  # three whole GPUs and two slots
        for unit in units:
            extra = {k: unit[k] for k in ("nodeId", "poolId", "poolName", "model", "state")}
            assert unit == atoms[unit["atomId"]] | extra, who
    globex = (await shared.read("gpus.list", {"state": ["unbooked"]}, "globex"))["gpus"]
    assert [u["deviceId"] for u in globex] == [FREE]
    assert all(s not in _text(globex) for s in [*_acme_secrets(shared), UNBOOKED_POD])
    idle = (await shared.read("gpus.list", {"state": ["idle"]}, "acme"))["gpus"]
    assert [u["deviceId"] for u in idle] == [IDLE]


async def test_a_replica_that_does_not_lead_shows_the_idle_mark_said(shared: Shared) -> None:
    """idleSince of reservations.get on a follower (issue 34): the leader's idle marks
    were in its memory only; a follower reads the said ones from the ledger."""
    rid = shared.rsv["acme-idle"]
    since = shared.watch.idle_since(rid)
    assert since is not None
    follower = GpuUseWatch(
        shared.ledger, Subjects("t"), shared.clock, RecordingPublisher(), RecordingAlerts(),
        reachable=lambda _: True,
    )  # fmt: skip
    assert follower.idle_since(rid) is None  # nothing read yet
    await follower.follow()
    assert follower.idle_since(rid) == since
    assert follower.idle_since(shared.rsv["acme-held"]) is None
    services = Services(shared.ledger, shared.clock, idle_since=follower.idle_since)
    async with TestClient(TestServer(build_app(services))) as client:
        api = Api(client.session, str(client.make_url("")).rstrip("/"), shared.api.operator_key)
        got = await api.ok("reservations.get", {"tenantId": "acme", "reservationId": rid})
        assert got["idleSince"] == since
    # A leader that stops leading shows the ledger's marks, not its memory.
    await shared.watch.follow()
    assert shared.watch.idle_since(rid) == since


async def test_metrics_answer_no_tenant_key(shared: Shared) -> None:
    """/metrics names every unit's holders and owners: operator data."""
    for key, status in ((shared.keys["globex"], 401), (shared.api.operator_key, 200)):
        async with shared.api.session.get(
            f"{shared.api.base}/metrics", headers={"Authorization": f"Bearer {key}"}
        ) as resp:
            assert resp.status == status
