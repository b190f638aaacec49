"""Chargeback's arithmetic (SPEC §13, issue 35): host memory held by owners' cgroups
becomes MiB-ms per tenant, pool and quarter, charged to the tenant of the reservation
its owner names, else of the operator's first matching rule, unattributed use apart;
reserved against used splits exactly into covered, unused and on demand, for
hand-computed workloads and for any."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.domain.booked_hours import UsageSpan
from coordinator.domain.consumption import (
    UNATTRIBUTED,
    MemoryAccrued,
    MemoryKey,
    accrue_memory,
    consumption,
    gb,
    gb_hours,
    merge_memory,
    reserved_mib_ms,
    totals,
)
from coordinator.domain.gpu_use_accrual import accrue
from coordinator.domain.gpu_use_report import UseHour, reservation_use
from coordinator.domain.gpu_use_units import Hold
from coordinator.domain.intervals import INTERVAL_MS as Q
from coordinator.domain.tenant_rules import parse_tenant_rules
from shared.wire import DeviceUse, OwnerMemory, ProcessUse
from tests.unit.coordinator.domain.test_tenant_rules import GOOD

T0 = 1_800_000_000_000  # on the grid
POOL = "pool_a"


def _use(*owners: tuple[str, str, int]) -> list[OwnerMemory]:
    return [
        OwnerMemory(owner_kind=kind, owner=owner, current_mib=mib, peak_mib=mib)  # type: ignore[arg-type]
        for kind, owner, mib in owners
    ]


def _row(reserved_gb: int, used_gb: int, tenant: str = "acme") -> dict[str, Decimal]:
    key = MemoryKey(T0, tenant, POOL)
    used = {key: MemoryAccrued(used_gb * 1024 * Q, used_gb * 1024)} if used_gb else {}
    (row,) = consumption({key: reserved_gb} if reserved_gb else {}, used)
    return {
        "reserved": gb(row.reserved), "used": gb(row.used), "covered": gb(row.covered),
        "unused": gb(row.unused), "onDemand": gb(row.on_demand),
    }  # fmt: skip


def test_a_workload_at_below_and_above_its_commitment() -> None:
    assert _row(16, 16) == {"reserved": 16, "used": 16, "covered": 16, "unused": 0, "onDemand": 0}
    assert _row(16, 12) == {"reserved": 16, "used": 12, "covered": 12, "unused": 4, "onDemand": 0}
    assert _row(16, 20) == {"reserved": 16, "used": 20, "covered": 16, "unused": 0, "onDemand": 4}


def test_a_tenant_with_no_commitment_is_all_on_demand() -> None:
    assert _row(0, 8) == {"reserved": 0, "used": 8, "covered": 0, "unused": 0, "onDemand": 8}


def test_a_commitment_with_no_use_is_all_unused() -> None:
    assert _row(8, 0) == {"reserved": 8, "used": 0, "covered": 0, "unused": 8, "onDemand": 0}


def test_unattributed_use_is_its_own_row_nothing_covers() -> None:
    assert _row(0, 8, UNATTRIBUTED)["onDemand"] == 8


def test_memory_goes_to_the_owners_tenant_and_the_rest_is_unattributed() -> None:
    uses = {
        "n1": _use(("reservation", "rsv_a", 2048), ("pod", "uid-1", 1024)),
        "n2": _use(("reservation", "rsv_a", 1024), ("reservation", "rsv_dead", 512)),
    }
    tenant_of = {"rsv_a": "acme"}
    # Half a quarter from n1, the other half of it and the next quarter's first half: n2.
    windows = {"n1": (T0, T0 + Q // 2), "n2": (T0 + Q // 2, T0 + 3 * Q // 2)}
    got = accrue_memory(uses, tenant_of, {"n1": POOL, "n2": POOL}, windows)
    assert got == {
        MemoryKey(T0, "acme", POOL): MemoryAccrued(2048 * Q // 2 + 1024 * Q // 2, 3072),
        MemoryKey(T0 + Q, "acme", POOL): MemoryAccrued(1024 * Q // 2, 3072),
        MemoryKey(T0, UNATTRIBUTED, POOL): MemoryAccrued(1024 * Q // 2 + 512 * Q // 2, 1536),
        MemoryKey(T0 + Q, UNATTRIBUTED, POOL): MemoryAccrued(512 * Q // 2, 1536),
    }
    # 16 GB held through a whole quarter is 16 GB used, 4 GB-hours.
    assert gb(16 * 1024 * Q) == 16 and gb_hours(16 * 1024 * Q) == 4


RULES = parse_tenant_rules(GOOD, "tenants.toml")


def test_an_owner_is_charged_by_reservation_then_rule_then_nobody() -> None:
    def mem(kind: str, owner: str, mib: int, **attrs: str) -> OwnerMemory:
        return OwnerMemory(owner_kind=kind, owner=owner, current_mib=mib, **attrs)  # type: ignore[arg-type]

    owners = [
        # A live reservation wins over a rule the same owner matches.
        mem("reservation", "rsv_a", 1000, slurm_account="physics"),
        mem("slurm", "42", 200, slurm_account="physics", unix_group="physics"),  # 1st rule
        mem("pod", "uid-1", 30, k8s_namespace="ml"),
        mem("systemd", "x.service", 4, unix_group="physics"),
        mem("reservation", "rsv_dead", 5000, k8s_namespace="web"),  # nothing matches
    ]
    got = accrue_memory(
        {"n1": owners}, {"rsv_a": "beta"}, {"n1": POOL}, {"n1": (T0, T0 + 1)}, RULES
    )
    assert {k.tenant_id: v.mib_ms for k, v in got.items()} == {
        "beta": 1000, "acme": 200, "globex": 30, "initech": 4, UNATTRIBUTED: 5000,
    }  # fmt: skip
    # Without the tenant created yet, its rule does not apply: nobody's, not a ghost's.
    only = RULES.only({"acme", "globex"})
    got = accrue_memory({"n1": owners}, {}, {"n1": POOL}, {"n1": (T0, T0 + 1)}, only)
    assert {k.tenant_id: v.mib_ms for k, v in got.items()} == {
        "acme": 1200, "globex": 30, UNATTRIBUTED: 5004,
    }  # fmt: skip


def test_a_quarter_peak_counts_each_owner_at_its_reported_peak() -> None:
    owners = [
        OwnerMemory(owner_kind="slurm", owner="1", current_mib=100, peak_mib=900),
        OwnerMemory(owner_kind="slurm", owner="2", current_mib=50),
    ]
    got = accrue_memory({"n1": owners}, {}, {"n1": POOL}, {"n1": (T0, T0 + 10)})
    assert got == {MemoryKey(T0, UNATTRIBUTED, POOL): MemoryAccrued(150 * 10, 950)}


def test_passes_add_up_and_peaks_take_the_larger() -> None:
    into = {MemoryKey(T0, "acme", POOL): MemoryAccrued(10, 5)}
    merge_memory(into, {MemoryKey(T0, "acme", POOL): MemoryAccrued(7, 3)})
    assert into == {MemoryKey(T0, "acme", POOL): MemoryAccrued(17, 5)}


procs_st = st.lists(
    st.tuples(
        st.sampled_from(["reservation", "pod", "unknown"]),
        st.sampled_from(["rsv_a", "rsv_b", "rsv_dead", "x"]),
        st.integers(0, 80_000),
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["n1", "n2", "n3"]), procs_st, max_size=3),
    st.dictionaries(
        st.tuples(st.integers(0, 7), st.sampled_from(["acme", "beta", "gamma"])),
        st.integers(1, 64).map(lambda k: 4 * k),
        max_size=12,
    ),
    st.lists(st.tuples(st.integers(0, 6 * Q), st.integers(1, 2 * Q)), min_size=1, max_size=4),
)
def test_for_any_reservations_and_use_the_split_is_exact(
    procs: dict[str, list[tuple[str, str, int]]],
    reserved_raw: dict[tuple[int, str], int],
    passes: list[tuple[int, int]],
) -> None:
    tenant_of = {"rsv_a": "acme", "rsv_b": "beta"}
    uses = {n: _use(*ps) for n, ps in procs.items()}
    used: dict[MemoryKey, MemoryAccrued] = {}
    held = 0
    for off, length in passes:
        windows = dict.fromkeys(uses, (T0 + off, T0 + off + length))
        merge_memory(used, accrue_memory(uses, tenant_of, dict.fromkeys(uses, POOL), windows))
        held += length * sum(mib for ps in procs.values() for _, _, mib in ps)
    reserved = {MemoryKey(T0 + k * Q, t, POOL): g for (k, t), g in reserved_raw.items()}
    rows = consumption(reserved, used)
    for r in rows:
        assert r.covered + r.unused == r.reserved
        assert r.covered + r.on_demand == r.used
        assert min(r.covered, r.unused, r.on_demand) >= 0
    # No use counted twice nor lost: the rows hold every MiB-ms the processes held,
    # each (quarter, pool) once per tenant, and unattributed use reserves nothing.
    assert sum(r.used for r in rows) == held
    keys = [(r.quarter, r.tenant_id, r.pool_id) for r in rows]
    assert len(keys) == len(set(keys))
    assert all(r.reserved == 0 for r in rows if r.tenant_id == UNATTRIBUTED)
    assert totals(rows).reserved == sum(reserved_mib_ms(g) for g in reserved.values())
    t = totals(rows)
    assert (t.covered + t.unused, t.covered + t.on_demand) == (t.reserved, t.used)


def test_idle_time_of_a_booking_is_counted_unused() -> None:
    """A device booking's used hours exclude the time its unit ran under the idle
    threshold: booked 3 minutes, busy 1, idle (a process at 2 %) 1, nothing 1."""
    m = 60_000
    hold = Hold("rsv_1", "acme", None, POOL, "n1", "gpu", ("GPU-1",), T0, T0 + 3 * m)
    total: dict[str, int] = {"used": 0, "idle": 0}
    for k, util in enumerate((80, 2, None)):
        procs = () if util is None else (ProcessUse(pid=1),)
        uses = {"n1": {"GPU-1": DeviceUse(device_id="GPU-1", sm_util=util, processes=procs)}}
        got = accrue(uses, [hold], {"n1": POOL}, {"n1": (T0 + k * m, T0 + (k + 1) * m)})
        for acc in got.values():
            total["used"] += acc.used_ms
            total["idle"] += acc.idle_ms
    assert total == {"used": 2 * m, "idle": m}
    span = UsageSpan("acme", POOL, None, "gpu", 1, T0, T0 + 3 * m, "rsv_1")
    hour = T0 - T0 % 3_600_000
    bucket = UseHour(hour, "rsv_1", "acme", POOL, None, "gpu", 2 * m, 0, 0, m)
    (row,), _ = reservation_use([span], [bucket], hour, hour + 3_600_000, hour + 3_600_000)
    busy, unused = row.used_ms - row.idle_ms, row.booked_ms - row.used_ms + row.idle_ms
    assert (row.booked_ms, busy, unused) == (3 * m, m, 2 * m)
