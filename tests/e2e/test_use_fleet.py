"""Promise against use with real processes (SPEC §10): a coordinator and a simulated
agent as subprocesses on a real nats-server. The agent's fault file runs a workload under
its booking, one with no booking, and leaves another booking idle; the coordinator says
`gpu.unbookedUse` and `reservation.idle` on NATS, `nodes.get` shows each GPU's users,
and `usage.report` counts the booking's used hours."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from agent.sim.faults import write_faults
from shared.wire import Alert
from tests.e2e.fleet_procs import Fleet, wait_for

pytestmark = pytest.mark.timeout(180)
POD = "1234abcd-5678-90ab-cdef-1234567890ab"
KUBE = f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{'b' * 64}.scope"


@pytest.fixture
def procs(tmp_path: Path, nats_url: str) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path, nats_url)
    try:
        fleet.start_coordinator("--use-interval-s", "0.5", "--idle-after-s", "3",
                                "--use-flush-s", "0")  # fmt: skip
        yield fleet
    finally:
        fleet.close()


async def _alerts(url: str, pool: str, kinds: set[str], within_s: float) -> list[Alert]:
    """Every alert of `pool` until each of `kinds` has come (from the stream's start:
    none missed). Only this pool's: the session's nats-server keeps the stream, with
    other tests' alerts in it."""
    nc = await nats.connect(url)
    got: list[Alert] = []
    try:
        js = nc.jetstream()
        sub = await js.subscribe(f"gpufleet.alert.{pool}.>", ordered_consumer=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while not kinds <= {a.kind for a in got}:
            left = deadline - loop.time()
            assert left > 0, [a.kind for a in got]
            try:
                msg = await sub.next_msg(timeout=min(left, 1.0))
            except nats.errors.TimeoutError:
                continue
            got.append(Alert.from_json(msg.data))
    finally:
        await nc.close()
    return got


def test_a_booked_workload_an_unbooked_one_and_an_idle_booking(procs: Fleet) -> None:
    op = procs.operator()
    op.call("tenants.create", {"tenantId": "acme"})
    pool = op.call("pools.create", {"tenantId": "acme", "name": "train"})["poolId"]
    faults = procs.workdir / "faults.json"
    write_faults(faults, [])
    procs.start_agent("gpu-a", pool, "h100-sxm-8", 1, "--fault-file", str(faults))

    def ready() -> bool:
        nodes = op.call("nodes.list", {"poolId": pool})["nodes"]
        return bool(nodes) and nodes[0]["status"] == "ready"

    wait_for(ready, timeout=60, what="agent ready")

    def book(key: str) -> dict[str, Any]:
        return op.call("reservations.create", {
            "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
            "duration": "1h", "idempotencyKey": key,
        })  # fmt: skip

    worked, idle = book("worked"), book("idle")
    atoms = {a["atomId"]: a for a in op.call("nodes.get", {"nodeId": "gpu-a"})["atoms"]}
    gpu_of = {r["reservationId"]: atoms[r["atoms"][0]["atomId"]] for r in (worked, idle)}
    held = {a["attrs"]["gpuIndex"] for a in gpu_of.values()}
    free_index = min(set(range(8)) - held)
    work_gpu = gpu_of[worked["reservationId"]]
    write_faults(faults, [
        {"kind": "process", "pid": 4242, "gpus": [work_gpu["attrs"]["gpuIndex"]],
         "memory_mib": 20480, "env": {"GPUFLEET_RESERVATION_ID": worked["reservationId"]},
         "util": {"shape": "constant", "level": 85}},
        {"kind": "process", "pid": 777, "gpu": free_index, "memory_mib": 2048, "cgroup": KUBE},
    ])  # fmt: skip

    got = asyncio.run(_alerts(procs.nats_url, pool, {"gpu.unbookedUse", "reservation.idle"}, 60))
    said = [a for a in got if a.kind == "gpu.unbookedUse"]
    # Said once: it is said again only after the unit's use cleared, and nothing clears it.
    assert len(said) == 1, [(a.at, a.device_id, a.details) for a in said]
    (unbooked,) = said
    free_uuid = next(
        a["deviceId"]
        for a in atoms.values()
        if a["attrs"].get("gpuIndex") == free_index and a["class"] == "gpu"
    )
    assert unbooked.device_id == free_uuid
    assert unbooked.details["owners"] == [{"pid": 777, "owner": POD, "ownerKind": "pod"}]
    idled = [a.reservation_id for a in got if a.kind == "reservation.idle"]
    assert idled == [idle["reservationId"]]  # the working booking never idles
    assert not [a for a in got if a.kind == "gpu.foreignUse"]

    def users() -> dict[str, list[tuple[str, str]]]:
        node = op.call("nodes.get", {"nodeId": "gpu-a"})
        return {
            a["deviceId"]: [(u["ownerKind"], u["owner"]) for u in a["use"]["users"]]
            for a in node["atoms"]
            if a.get("use")
        }

    wait_for(lambda: users().get(work_gpu["deviceId"]) == [
        ("reservation", worked["reservationId"])
    ], what="the booked GPU's user")  # fmt: skip
    assert users()[free_uuid] == [("pod", POD)]

    def used() -> float:
        report = op.call("usage.report", {"byReservation": True})
        rows = {r["reservationId"]: r for r in report["byReservation"]}
        return float(rows[worked["reservationId"]]["usedHours"])

    wait_for(lambda: used() > 0, what="used hours accounted")
    report = op.call("usage.report", {"byReservation": True})
    rows = {r["reservationId"]: r for r in report["byReservation"]}
    assert rows[idle["reservationId"]]["usedHours"] == 0
    assert report["unbooked"] and report["unbooked"][0]["usedHours"] > 0
