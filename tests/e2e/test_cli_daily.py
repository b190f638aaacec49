"""An operator's and a tenant's day with `gpufleet` (issue 34): the whole fleet's
summary, `reserve`/`extend`/`release`, `maintenance --dry-run`, and use shown like
nvidia-smi's processes in `node`, `gpus` and `nodes`: the real command in a subprocess,
piped and on a pty, against a coordinator with simulated agents running processes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.sim.faults import write_faults
from shared.rfc3339 import parse_ms
from tests.e2e.cli_world import World, json_of, on_terminal, piped, running_fleet, two_tenants
from tests.e2e.fleet_procs import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
POD = "1234abcd-5678-90ab-cdef-1234567890ab"
KUBE = f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{'b' * 64}.scope"


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """acme's pool of H100s (node h100-a) and a mixed pool of A100s and L40S offered to
    globex; one 2-GPU booking on h100-a."""
    tmp = tmp_path_factory.mktemp("day")
    with running_fleet(tmp, "--use-interval-s", "0.5") as (fleet, nats_url):
        pools = two_tenants(fleet)
        op = pools.op
        write_faults(tmp / "faults.json", [])
        fleet.start_agent("h100-a", pools.h100, "h100-sxm-8", 1.0,
                          "--fault-file", str(tmp / "faults.json"))  # fmt: skip
        fleet.start_agent("a100-a", pools.mixed, "a100-mig-8", 1.0)
        fleet.start_agent("l40s-a", pools.mixed, "l40s-pcie-4", 1.0)

        def ready() -> bool:
            nodes = op.call("nodes.list", {})["nodes"]
            return len(nodes) == 3 and all(n["status"] == "ready" for n in nodes)

        wait_for(ready, timeout=90, what="three ready nodes")
        yield pools.booked(fleet, nats_url, tmp, "day-1")


def test_summary_operator_shows_the_whole_fleet(day: World) -> None:
    """docs/operator.md's install check: `gpufleet summary operator` with the operator key."""
    data = json_of(day, "summary", "operator")
    assert {p["name"] for p in data["pools"]} == {"h100-east", "mixed"}, data
    assert data["byGpuModel"]["H100"]["total"] == 8, data
    # The mixed pool's A100s and L40S each have their totals, not one `other`.
    mixed = next(p for p in data["pools"] if p["name"] == "mixed")
    l40s = {m: c for m, c in mixed["gpuModels"].items() if "L40S" in m}
    assert [c["total"] for c in l40s.values()] == [4], mixed["gpuModels"]
    shown = on_terminal(day, "summary", "operator")
    assert shown.code == 0 and "no GPUs" not in shown.out, shown.out
    assert "pool h100-east" in shown.out and "pool mixed" in shown.out, shown.out
    (row,) = [x for x in shown.out.splitlines() if x.startswith("other: ") and "L40S" in x]
    assert row.split()[-5:] == ["4", "4", "0", "0", "4"], row
    # A tenant named is still that tenant's view.
    globex = json_of(day, "summary", "globex")
    assert [p["name"] for p in globex["pools"]] == ["mixed"]


def test_reserve_extend_and_release_from_flags(day: World) -> None:
    key = day.acme_key
    booked = on_terminal(day, "reserve", "-p", "h100-east", "-n", "2", "-m", "H100",
                         "-d", "2h", key=key)  # fmt: skip
    assert booked.code == 0, booked.out
    line = booked.out.strip()
    assert re.fullmatch(r"rsv_\w+ active: 2 gpu on h100-a, \S+ → \S+", line), line
    rid = line.split()[0]
    got = json_of(day, "reservation", rid, key=key)
    assert got["poolId"] == day.h100 and len(got["atoms"]) == 2
    # Piped: the API's answer, a lease and a window by --start/--end.
    leased = piped(day, "reserve", "-p", day.h100, "--start", "+1h", "--end", "+3h",
                   "--lease", "600", key=key)  # fmt: skip
    assert leased.code == 0, leased.err
    made = json.loads(leased.out)
    assert made["state"] == "scheduled" and made["leaseExpiresAt"], made
    extended = on_terminal(day, "extend", made["reservationId"], "--lease", "900", key=key)
    assert extended.code == 0, extended.out
    assert extended.out.strip().startswith(f"{made['reservationId']} renewed, scheduled; lease")
    # An operator names no tenant: the reservation's own is used.
    released = on_terminal(day, "release", rid)
    assert released.out.strip().startswith(f"{rid} → released"), released.out
    gone = json_of(day, "release", made["reservationId"], key=key)
    assert gone["state"] == "released"
    # Bad input: a clear error, nothing booked.
    before = len(json_of(day, "reservations", "--state", "live"))
    for args, said in (
        (["-d", "1h", "--end", "+2h"], "give --duration or --end"),
        (["-d", "1h", "-m", "A100"], "no GPU model 'A100' in that pool"),
        (["-d", "1h", "-n", "9"], "CAPACITY_NOT_AVAILABLE"),
    ):
        bad = piped(day, "reserve", "-p", "h100-east", *args, key=key)
        assert bad.code in (1, 2) and said in bad.err, (args, bad.err)
        assert len(bad.err.strip().splitlines()) == 1, bad.err
    assert len(json_of(day, "reservations", "--state", "live")) == before


def test_extend_moves_a_bookings_end_on_its_own_gpus(day: World) -> None:
    """`extend --by/--until` moves a booking's end where its GPUs are free, says what
    changed, and with --dry-run changes nothing; a booking of those GPUs after it makes
    it a one-line refusal, nothing changed."""
    key = day.acme_key
    made = json_of(day, "reserve", "-p", "h100-east", "-d", "1h", key=key)
    rid, end = made["reservationId"], parse_ms(made["end"])

    op = day.fleet.operator()

    def end_now() -> int:
        return int(op.call("reservations.get", {"reservationId": rid})["end"])

    tried = on_terminal(day, "extend", rid, "--by", "30m", "--dry-run", key=key)
    assert tried.code == 0, tried.out
    assert re.fullmatch(rf"dry run: {rid} could move \(\+30m\): end \S+ → \S+; nothing changed",
                        tried.out.strip()), tried.out  # fmt: skip
    assert end_now() == end
    moved = on_terminal(day, "extend", rid, "--by", "30m", key=key)
    assert re.fullmatch(rf"{rid} extended \+30m, active: end \S+ → \S+", moved.out.strip()), (
        moved.out
    )
    assert end_now() == end + 1_800_000
    # Piped: the API's answer; --until takes a time, here an hour after the first end.
    until = datetime.fromtimestamp((end + 3_600_000) / 1000, UTC).isoformat()
    answer = json_of(day, "extend", rid, "--until", until, key=key)
    assert (parse_ms(answer["previousEnd"]), parse_ms(answer["end"]), answer["dryRun"]) == (
        end + 1_800_000, end + 3_600_000, False,
    )  # fmt: skip
    # The operator books the whole node after it: its GPUs are no longer free then.
    node = op.call("reservations.create", {
        "tenantId": "acme", "poolId": day.h100, "devices": [{"class": "node", "count": 1}],
        "start": end + 3_600_000, "duration": "1h", "idempotencyKey": "after-it",
    })  # fmt: skip
    try:
        refused = piped(day, "extend", rid, "--by", "1h", key=key)
        assert refused.code == 1 and "CAPACITY_NOT_AVAILABLE" in refused.err, refused.err
        assert len(refused.err.strip().splitlines()) == 1, refused.err
        assert end_now() == end + 3_600_000
        for args, said in ((["--by", "1h", "--until", "+3h"], "not both"),
                           (["--by", "soon"], "cannot read duration")):  # fmt: skip
            bad = piped(day, "extend", rid, *args, key=key)
            assert bad.code == 2 and said in bad.err, (args, bad.err)
        assert end_now() == end + 3_600_000
    finally:
        op.call(
            "reservations.release", {"tenantId": "acme", "reservationId": node["reservationId"]}
        )
        piped(day, "release", rid, key=key)


def test_maintenance_dry_run_lists_what_it_would_put_at_risk(day: World) -> None:
    shown = on_terminal(day, "maintenance", "h100-a", "--dry-run")
    assert shown.code == 0, shown.out
    assert re.search(r"h100-a → maintenance would put \d+ reservations? at risk; nothing "
                     r"changed", shown.out), shown.out  # fmt: skip
    held = [x for x in shown.out.splitlines() if day.reservation in x]
    assert len(held) == 1 and "h100-a" in held[0], shown.out
    data = json_of(day, "maintenance", "h100-a", "--dry-run")
    assert data["dryRun"] is True and day.reservation in {
        r["reservationId"] for r in data["reservations"]
    }, data
    assert all(r["state"] in ("scheduled", "active", "noticed") for r in data["reservations"])
    # Nothing changed: the node is ready, the booking not at risk.
    node = json_of(day, "node", "h100-a")
    assert node["status"] == "ready" and not node["state"]["maintenance"]["value"]
    booking = json_of(day, "reservation", day.reservation)
    assert booking.get("atRisk") is None, booking
    empty = on_terminal(day, "maintenance", "l40s-a", "--dry-run")
    assert "would put 0 reservations at risk" in empty.out and "no bookings on it" in empty.out


def test_reservations_show_since_when_a_booking_is_idle(day: World) -> None:
    """The fixture's booking runs nothing (until the next test runs a process on it)."""
    wait_for(lambda: "idleSince" in json_of(day, "reservation", day.reservation), timeout=30,
             what="the booking judged idle")  # fmt: skip
    since = json_of(day, "reservation", day.reservation)["idleSince"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", since), since
    table = on_terminal(day, "reservations", "--state", "live")
    assert re.search(r"NODES\s+IDLE SINCE\s+AT RISK", table.out), table.out
    (row,) = [x for x in table.out.splitlines() if day.reservation in x]
    assert since[:19] in row, (since, row)
    listed = json_of(day, "reservations", "--state", "live")
    assert {r["reservationId"]: r.get("idleSince") for r in listed}[day.reservation] == since


def test_node_gpus_and_nodes_show_use_like_nvidia_smi(day: World) -> None:
    atoms = json_of(day, "node", "h100-a")["atoms"]
    held = next(a for a in atoms if (a.get("heldBy") or {}).get("reservationId") == day.reservation)
    free = next(a for a in atoms if a["class"] == "gpu" and not a.get("heldBy"))
    write_faults(Path(day.tmp) / "faults.json", [
        {"kind": "process", "pid": 4242, "gpus": [held["attrs"]["gpuIndex"]],
         "memory_mib": 20480, "env": {"GPUFLEET_RESERVATION_ID": day.reservation},
         "util": {"shape": "constant", "level": 85}},
        {"kind": "process", "pid": 777, "gpu": free["attrs"]["gpuIndex"], "memory_mib": 2048,
         "cgroup": KUBE},
    ])  # fmt: skip

    def users(atom_id: str) -> list[str]:
        a = next(x for x in json_of(day, "node", "h100-a")["atoms"] if x["atomId"] == atom_id)
        return [u["owner"] for u in (a.get("use") or {}).get("users", [])]

    wait_for(lambda: users(free["atomId"]) == [POD] and users(held["atomId"]) != [],
             timeout=60, what="both processes seen")  # fmt: skip
    # In use now: no longer idle.
    wait_for(lambda: "idleSince" not in json_of(day, "reservation", day.reservation), timeout=30,
             what="the booking in use")  # fmt: skip
    try:
        node = on_terminal(day, "node", "h100-a")
        header = next(x for x in node.out.splitlines() if x.startswith("CLASS"))
        assert re.search(r"USE\s+SM %\s+MEMORY\s+USERS", header), header
        pod_line = next(x for x in node.out.splitlines() if f"pod:{POD}" in x)
        assert re.search(r"\bbusy\b.*2048 MiB\s+777 pod:", pod_line), pod_line
        mine = next(x for x in node.out.splitlines() if "4242 reservation:" in x)
        assert day.reservation in mine and "20480 MiB" in mine, mine
        assert "pool h100-east" in node.out  # the pool by name

        # gpus: every GPU of the fleet, filterable; unbooked use found at once.
        every = json_of(day, "gpus")
        assert {g["nodeId"] for g in every} == {"h100-a", "a100-a", "l40s-a"}, every
        unbooked = json_of(day, "gpus", "--state", "unbooked")
        assert [g["atomId"] for g in unbooked] == [free["atomId"]], unbooked
        l40s = json_of(day, "gpus", "-m", "l40s", "-p", "mixed")
        assert len(l40s) == 4 and {g["nodeId"] for g in l40s} == {"l40s-a"}, l40s
        table = on_terminal(day, "gpus", "--state", "held", "-l", "gpu.count=8")
        rows = [x for x in table.out.splitlines() if x.startswith("h100-a")]
        assert table.code == 0 and len(rows) == 2, table.out
        assert all(day.reservation in x and "held" in x for x in rows), rows
        assert re.search(r"^NODE\s+GPU\s+POOL\s+MODEL\s+STATE", table.out, re.M), table.out
        assert "pool_" not in table.out  # ids only on request
        assert "pool_" in on_terminal(day, "gpus", "-o", "wide", "-p", "h100-east").out

        # nodes: used, free and busy GPUs; filtered by state and label.
        nodes = on_terminal(day, "nodes", "-s", "ready", "-l", "gpu.count=8")
        assert re.search(r"GPUS\s+USED\s+FREE\s+BUSY", nodes.out), nodes.out
        (h100,) = [x for x in nodes.out.splitlines() if x.startswith("h100-a")]
        assert re.search(r"\b8\s+2\s+6\s+2\b", h100), h100
        assert "l40s-a" not in nodes.out
        only = json_of(day, "nodes", "-l", "gpu.count=4")
        assert [n["nodeId"] for n in only] == ["l40s-a"], only
        assert json_of(day, "nodes", "-s", "maintenance") == []
    finally:
        write_faults(Path(day.tmp) / "faults.json", [])


def test_node_and_gpus_name_a_containers_owner(day: World) -> None:
    """Issue 34: a process in a Docker container shows as `container:<name>`, here the
    hostname Docker gave it (the agent reads it from /proc/<pid>/environ), in the API,
    `node` on a terminal and `gpus` piped."""
    atoms = json_of(day, "node", "h100-a")["atoms"]
    gpu = next(a for a in atoms if a["class"] == "gpu" and not a.get("heldBy"))
    write_faults(Path(day.tmp) / "faults.json", [
        {"kind": "process", "pid": 515, "gpu": gpu["attrs"]["gpuIndex"], "memory_mib": 1024,
         "cgroup": f"0::/system.slice/docker-{'c' * 64}.scope", "env": {"HOSTNAME": "trainer"}},
    ])  # fmt: skip

    def users() -> list[dict[str, Any]]:
        a = next(x for x in json_of(day, "node", "h100-a")["atoms"] if x["atomId"] == gpu["atomId"])
        return list((a.get("use") or {}).get("users", []))

    try:
        # Wait for this process, not any: the test before may leave its pod's process on
        # the same GPU until the agent's next report drops it.
        wait_for(lambda: [u["pid"] for u in users()] == [515], timeout=60,
                 what="the container's process seen")  # fmt: skip
        assert users() == [{"pid": 515, "owner": "c" * 64, "ownerKind": "container",
                            "ownerName": "trainer"}]  # fmt: skip
        shown = on_terminal(day, "node", "h100-a")
        assert shown.code == 0 and "515 container:trainer" in shown.out, shown.out
        listed = piped(day, "gpus", "-o", "table", "-p", "h100-east")
        assert "515 container:trainer" in listed.out, listed.out
    finally:
        write_faults(Path(day.tmp) / "faults.json", [])


def test_projects_are_issued_and_named_wherever_an_id_is_asked(day: World) -> None:
    key = day.acme_key
    made = on_terminal(day, "projects", "create", "llm", key=key)
    assert re.fullmatch(r"project llm created for acme: prj_\w{26}", made.out.strip()), made.out
    pid = made.out.split()[-1]
    listed = json_of(day, "projects", "list", key=key)
    assert [(p["name"], p["projectId"]) for p in listed] == [("llm", pid)]
    table = on_terminal(day, "projects", "list")  # operator: every tenant's
    assert re.search(rf"^llm\s+{pid}\s+acme\b", table.out, re.M), table.out
    dup = piped(day, "projects", "create", "llm", key=key)
    assert dup.code == 1 and "ALREADY_EXISTS" in dup.err, dup.err

    booked = json.loads(
        piped(day, "reserve", "-p", "h100-east", "-d", "30m", "--project", "llm", key=key).out
    )
    assert booked["projectId"] == pid, booked
    for args in (["reservations", "--project", "llm"],
                 ["api", "reservations.list", "--project-id", "llm"]):  # fmt: skip
        found = json_of(day, *args, key=key)
        rows = found["reservations"] if isinstance(found, dict) else found
        assert [r["reservationId"] for r in rows] == [booked["reservationId"]], (args, found)
    assert piped(day, "usage", "--project", "llm", key=key).code == 0
    unknown = piped(day, "reserve", "-p", "h100-east", "-d", "1h", "--project", "nope", key=key)
    assert unknown.code == 2 and "no project named 'nope'" in unknown.err, unknown.err
    piped(day, "release", booked["reservationId"], key=key)


def test_api_takes_pool_names_and_prints_tables_and_help_names_no_files(day: World) -> None:
    rows = on_terminal(day, "api", "capacity.byPool", "--tenant-id", "acme",
                       "--pool-id", "h100-east", "-o", "table")  # fmt: skip
    assert rows.code == 0 and not rows.out.lstrip().startswith("{"), rows.out
    assert re.search(r"^RESOURCE\s+TOTAL\s+ALLOCATABLE", rows.out, re.M), rows.out
    assert f"poolId: {day.h100}" in rows.out
    piped_json = json_of(day, "api", "capacity.byPool", "--tenant-id", "acme",
                                  "--pool-id", "h100-east")  # fmt: skip
    assert piped_json["poolId"] == day.h100
    csv_out = piped(day, "api", "nodes.list", "-o", "csv").out.splitlines()
    assert csv_out[0].startswith("nodeId,") and len(csv_out) == 4, csv_out
    raw = on_terminal(day, "-o", "table", "call", "tenants.list")
    assert re.search(r"^TENANTID\s+NAME", raw.out, re.M), raw.out
    unknown = piped(day, "api", "capacity.byPool", "--tenant-id", "acme", "--pool-id", "nope")
    assert unknown.code == 2 and "no pool named 'nope'" in unknown.err, unknown.err
    shown = piped(day, "--help").out
    assert "reserve" in shown and "gpus" in shown, shown
    for internal in ("ops/", "ops.", ".json", ".py"):
        assert internal not in shown, (internal, shown)
