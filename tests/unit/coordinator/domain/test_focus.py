"""The FOCUS export's rows (issue 35), pure: a tenant's use fills its interval
reservations oldest first and each row names the real reservation; region and zone come
from the node labels all the nodes share; MIG instances and time-slice slots are priced
by their share of the GPU; decimals are exact, half to even; unbooked use is the one
tenant's its processes belong to, else unattributed."""

from __future__ import annotations

from fractions import Fraction

from coordinator.domain.consumption import Consumption
from coordinator.domain.focus import (
    COLUMNS,
    Place,
    ReservedShare,
    csv_chunks,
    fixed,
    memory_rows,
    place,
)
from coordinator.domain.focus_devices import DeviceHour, device_rows, gpu_share, mean_share
from coordinator.domain.gpu_use_accrual import HOUR_MS, UNBOOKED, AccrualKey, accrue
from coordinator.domain.gpu_use_report import UnbookedUse, UseHour, reservation_use
from coordinator.domain.intervals import INTERVAL_MS as Q
from coordinator.domain.rate_card import parse_rate_card
from shared.wire import DeviceUse, ProcessUse

GIB_Q = 1024 * Q
CARD = parse_rate_card(
    'currency = "EUR"\n[[rate]]\nresource = "memory_gb"\nmodel = "*"\nreserved = "0.01"\n'
    'on_demand = "0.02"\neffective_from = 2020-01-01\n[[rate]]\nresource = "gpu"\n'
    'model = "*"\nreserved = "2.00"\non_demand = "3.00"\neffective_from = 2020-01-01\n',
    "card.toml",
)
T0 = 1_800_000_000_000 // Q * Q
WHERE = Place("eu-west", "eu-west-1a")


def _cells(rows: list[list[str]]) -> list[dict[str, str]]:
    return [dict(zip(COLUMNS, r, strict=True)) for r in rows]


def test_use_fills_the_oldest_reservation_first_and_names_each() -> None:
    # 16 GB then 8 GB reserved; 20 GB used: the first is used whole, the second half.
    row = Consumption(T0, "acme", "pool", 24 * GIB_Q, 20 * GIB_Q, 20 * 1024)
    commitments = {(T0, "acme", "pool"): [ReservedShare("ir_old", 16), ReservedShare("ir_new", 8)]}
    got = _cells(list(memory_rows([row], commitments, {"pool": WHERE}, CARD)))
    assert [(r["CapacityReservationId"], r["CapacityReservationStatus"], r["ConsumedQuantity"],
             r["BilledCost"]) for r in got] == [
        ("ir_old", "Used", "4.0000000000", "0.0400000000"),
        ("ir_new", "Used", "1.0000000000", "0.0100000000"),
        ("ir_new", "Unused", "1.0000000000", "0.0100000000"),
    ]  # fmt: skip
    assert {(r["RegionId"], r["AvailabilityZone"], r["SubAccountId"]) for r in got} == {
        ("eu-west", "eu-west-1a", "acme")
    }
    # Above every reservation: the rest is on demand, with no reservation id.
    over = Consumption(T0, "acme", "pool", 24 * GIB_Q, 28 * GIB_Q, 28 * 1024)
    last = _cells(list(memory_rows([over], commitments, {}, CARD)))[-1]
    assert (last["CapacityReservationId"], last["CapacityReservationStatus"]) == ("", "")
    assert (last["ConsumedQuantity"], last["BilledCost"], last["RegionId"]) == (
        "1.0000000000", "0.0200000000", "",
    )  # fmt: skip


def test_region_and_zone_are_what_every_node_shares() -> None:
    k8s = {"topology.kubernetes.io/region": "eu-west", "topology.kubernetes.io/zone": "eu-west-1a"}
    ours = {"gpufleet.io/region": "eu-west", "gpufleet.io/zone": "eu-west-1b"}
    assert place([k8s, k8s]) == WHERE
    assert place([k8s, ours]) == Place("eu-west", "")  # zones differ: null
    assert place([k8s, {}]) == Place()  # a node without labels: unknown
    assert place([]) == Place()


def test_mig_and_slots_are_priced_by_their_share_of_the_gpu() -> None:
    assert gpu_share("gpu", {}) == 1
    assert gpu_share("gpu.mig", {"profile": "3g.40gb"}) == Fraction(3, 7)
    assert gpu_share("gpu.mig", {"profile": "7g.80gb"}) == 1
    assert gpu_share("gpu.slot", {"replicas": 4}) == Fraction(1, 4)
    assert mean_share([Fraction(1, 7), Fraction(3, 7)]) == (2, 7)
    hours = [
        DeviceHour(T0, "rsv_mig", "acme", "pool", "H100", "gpu.mig", HOUR_MS, HOUR_MS, 0,
                   share=(3, 7)),
        DeviceHour(T0, "rsv_slot", "acme", "pool", "H100", "gpu.slot", 2 * HOUR_MS, HOUR_MS,
                   0, share=(1, 4)),
        DeviceHour(T0, "", "beta", "pool", "H100", "gpu", 0, HOUR_MS // 2, 0),
        DeviceHour(T0, "rsv_node", "acme", "pool", "H100", "node", HOUR_MS, 0, 0),
    ]  # fmt: skip
    got = {
        (r["CapacityReservationId"], r["CapacityReservationStatus"]): (
            r["ConsumedQuantity"], r["ConsumedUnit"], r["BilledCost"], r["SubAccountId"])
        for r in _cells(list(device_rows(hours, CARD)))
    }  # fmt: skip
    assert got == {
        ("rsv_mig", "Used"): ("1.0000000000", "MIG-Hours", "0.8571428571", "acme"),
        ("rsv_slot", "Used"): ("1.0000000000", "Slot-Hours", "0.5000000000", "acme"),
        ("rsv_slot", "Unused"): ("1.0000000000", "Slot-Hours", "0.5000000000", "acme"),
        ("", ""): ("0.5000000000", "GPU-Hours", "1.5000000000", "beta"),
        ("rsv_node", "Unused"): ("1.0000000000", "Node-Hours", "0.0000000000", "acme"),
    }


def test_decimals_are_exact_and_round_half_to_even() -> None:
    assert fixed(1, 3) == "0.3333333333"
    assert fixed(2, 3) == "0.6666666667"
    assert fixed(5, 10**11) == "0.0000000000"  # half: to the even 0
    assert fixed(15, 10**11) == "0.0000000002"  # half: to the even 2
    assert fixed(123, 1) == "123.0000000000"
    # Exact beyond Decimal's default 28 digits: integers, not a context's precision.
    assert fixed(10**30 + 1, 10**10) == "100000000000000000000.0000000001"


def test_csv_has_the_header_alone_without_rows_and_crlf_lines() -> None:
    assert b"".join(csv_chunks([])) == (",".join(COLUMNS) + "\r\n").encode()
    rows = [["x"] * len(COLUMNS)] * 5
    assert b"".join(csv_chunks(rows, rows_per_chunk=2)).count(b"\r\n") == 6


def test_unbooked_use_is_its_owners_one_tenant_else_nobodys() -> None:
    def use(*owners: str) -> dict[str, dict[str, DeviceUse]]:
        procs = tuple(
            ProcessUse(pid=k + 1, owner=o, owner_kind="reservation") for k, o in enumerate(owners)
        )
        return {"n1": {"GPU-0": DeviceUse(device_id="GPU-0", sm_util=80, processes=procs)}}

    tenant_of = {"rsv-a": "acme", "rsv-a2": "acme", "rsv-b": "beta"}
    window = {"n1": (T0, T0 + 60_000)}
    for owners, tenant in ((("rsv-a", "rsv-a2"), "acme"), (("rsv-a", "rsv-b"), ""),
                           (("rsv-gone",), "")):  # fmt: skip
        got = accrue(use(*owners), [], {"n1": "pool"}, window, tenant_of=tenant_of)
        key = AccrualKey(T0 - T0 % HOUR_MS, UNBOOKED, "n1", "GPU-0", "gpu", tenant)
        assert list(got) == [key] and got[key].used_ms == 60_000
    # Reported per tenant and pool, the unattributed apart.
    hour = T0 - T0 % HOUR_MS
    buckets = [
        UseHour(hour, UNBOOKED, t, "pool", None, "gpu", ms, ms)
        for t, ms in (("acme", 60), ("", 30))
    ]
    _, unbooked = reservation_use([], buckets, hour, hour + HOUR_MS, hour + HOUR_MS)
    assert unbooked == [UnbookedUse("pool", 30, 30, ""), UnbookedUse("pool", 60, 60, "acme")]
