"""Memory use by tenant (issue 35, point 1), through the use pass on a real ledger (SQLite
and PostgreSQL): the host memory each owner's cgroup holds, as an agent reports it, is
charged to the tenant of the live reservation it names (booked on that node), else of
the operator's first matching rule, else kept apart as unattributed; never dropped,
never counted for two tenants; a rule whose tenant does not exist yet charges nobody
until it does."""

from __future__ import annotations

import msgspec

from coordinator.domain.consumption import UNATTRIBUTED
from coordinator.domain.tenant_rules import parse_tenant_rules
from coordinator.ledger import Ledger
from coordinator.services.consumption import memory_consumption
from coordinator.services.gpu_use_watch import GpuUseWatch
from coordinator.services.reservations import Created
from shared.subjects import Subjects
from shared.wire import OwnerMemory, UseReport
from tests.factories import make_heartbeat, make_inventory
from tests.fakes import RecordingAlerts, RecordingPublisher
from tests.rig import TENANT, Rig
from tests.unit.coordinator.domain.test_tenant_rules import GOOD

STEP_MS = 10_000
DEAD = "rsv_01jzzzzzzzzzzzzzzzzzzzzzzz"


async def test_each_owner_is_charged_to_one_tenant_or_kept_apart(ledger: Ledger) -> None:
    rig = await Rig.open(ledger)
    await ledger.tenants.create("globex", "Globex", rig.clock.now_ms())
    pool = await rig.pool(nodes=2, gpus=1)
    created = await rig.reservations.create(rig.request(pool, "r1"))
    elsewhere = await rig.reservations.create(rig.request(pool, "r2"))
    assert isinstance(created, Created) and isinstance(elsewhere, Created)
    rsv = created.reservation.reservation_id
    node = created.reservation.atoms[0].node_id
    assert elsewhere.reservation.atoms[0].node_id != node
    watch = GpuUseWatch(
        ledger, Subjects("t"), rig.clock, RecordingPublisher(), RecordingAlerts(),
        reachable=lambda _: True, max_gap_ms=60_000, flush_ms=0,
        rules=parse_tenant_rules(GOOD, "tenants.toml"),
    )  # fmt: skip
    watch.on_inventory(make_inventory(node, pool, gpus=1))
    owners = (
        # Its reservation's tenant, though the rule would say globex: the reservation wins.
        OwnerMemory(
            owner_kind="reservation", owner=rsv, current_mib=4096, peak_mib=8192,
            k8s_namespace="ml",
        ),
        OwnerMemory(owner_kind="pod", owner="uid-1", current_mib=2048, k8s_namespace="ml"),
        # initech does not exist (yet): nobody's, not a ghost tenant's.
        OwnerMemory(
            owner_kind="systemd", owner="x.service", current_mib=1024, unix_group="physics"
        ),
        OwnerMemory(owner_kind="slurm", owner="42", current_mib=512),
        OwnerMemory(owner_kind="reservation", owner=DEAD, current_mib=256),  # not live
        # Live, but booked on the other node: naming it here charges nobody.
        OwnerMemory(
            owner_kind="reservation", owner=elsewhere.reservation.reservation_id,
            current_mib=64,
        ),
        OwnerMemory(owner_kind="unknown", current_mib=128),
    )  # fmt: skip
    start = rig.clock.now_ms()
    for version in range(1, 8):  # seven passes, six windows of 10 s
        watch.on_report(
            UseReport(
                node_id=node, pool_id=pool, boot_id="b", sent_at=0, use_version=version,
                memory=owners,
            )
        )  # fmt: skip
        await watch.tick()
        if version < 7:
            rig.clock.advance(STEP_MS)
    held = await ledger.memory_use.used(start - 3_600_000, start + 3_600_000)
    by_tenant: dict[str, tuple[int, int]] = {}
    for key, acc in held.items():
        assert key.pool_id == pool
        ms, peak = by_tenant.get(key.tenant_id, (0, 0))
        by_tenant[key.tenant_id] = (ms + acc.mib_ms, max(peak, acc.peak_mib))
    window = 6 * STEP_MS
    assert by_tenant == {
        TENANT: (4096 * window, 8192),
        "globex": (2048 * window, 2048),
        UNATTRIBUTED: ((1024 + 512 + 256 + 64 + 128) * window, 1024 + 512 + 256 + 64 + 128),
    }
    # Every MiB-ms once: the sum is what the host's owners held, under one tenant each.
    assert sum(ms for ms, _ in by_tenant.values()) == sum(o.current_mib for o in owners) * window
    # A tenant reads its own rows, never the unattributed ones.
    mine = await memory_consumption(ledger, start - 3_600_000, start + 3_600_000, TENANT, None)
    assert {r.tenant_id for r in mine} == {TENANT} and sum(r.used for r in mine) == 4096 * window

    # Once initech exists its rule applies, from the next pass on.
    await ledger.tenants.create("initech", "Initech", rig.clock.now_ms())
    rig.clock.advance(STEP_MS)
    watch.on_report(
        UseReport(node_id=node, pool_id=pool, boot_id="b", sent_at=0, use_version=8, memory=owners)
    )
    await watch.tick()
    after = await ledger.memory_use.used(start - 3_600_000, start + 3_600_000)
    assert sum(a.mib_ms for k, a in after.items() if k.tenant_id == "initech") == 1024 * STEP_MS


async def test_an_owner_gone_from_a_heartbeat_stops_counting(ledger: Ledger) -> None:
    """Owners' memory rides heartbeat deltas: an entry of 0 MiB removes the owner."""
    rig = await Rig.open(ledger)
    pool = await rig.pool(nodes=1, gpus=1)
    node = f"{pool[-6:]}-n0"
    watch = GpuUseWatch(
        ledger, Subjects("t"), rig.clock, RecordingPublisher(), RecordingAlerts(),
        reachable=lambda _: True, max_gap_ms=60_000, flush_ms=0,
    )  # fmt: skip
    inv = make_inventory(node, pool, gpus=1)
    watch.on_inventory(inv)
    job = OwnerMemory(owner_kind="slurm", owner="42", current_mib=1000)
    watch.on_report(
        UseReport(node_id=node, pool_id=pool, boot_id=inv.boot_id, sent_at=0, use_version=1,
                  memory=(job,))
    )  # fmt: skip
    start = rig.clock.now_ms()
    await watch.tick()
    rig.clock.advance(STEP_MS)
    gone = OwnerMemory(owner_kind="slurm", owner="42")
    beat = make_heartbeat(inv, 2, use_base=1, use_version=2)
    watch.on_heartbeat(msgspec.structs.replace(beat, memory=(gone,)))
    await watch.tick()  # the window just ended counts what was seen at its end: nothing
    rig.clock.advance(STEP_MS)
    await watch.tick()
    held = await ledger.memory_use.used(start - 3_600_000, start + 3_600_000)
    assert sum(a.mib_ms for a in held.values()) == 0
    assert watch.book.nodes[node].memory == {}
