"""The scontrol adapter's pure half: Slurm 22.05's one-line `show node` and `show
reservation` (lines captured from a real slurmctld), host lists, and the argv of each
action (tests/e2e/test_slurm_bridge.py runs them against a real one)."""

from __future__ import annotations

import pytest

from ops.slurm.bridge.model import (
    CreateReservation,
    DeleteReservation,
    Drain,
    Resume,
    SlurmReservation,
    UpdateReservation,
)
from ops.slurm.bridge.scontrol import (
    action_argv,
    expand_hostlist,
    format_time,
    gpu_types,
    parse_nodes,
    parse_reservations,
    parse_time,
)

NODE = (
    "NodeName=node-a Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.24 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:8(S:0-1) NodeAddr=127.0.0.1 "
    "NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 "
    "AllocMem=0 FreeMem=21308 Sockets=2 Boards=1 State=IDLE+DRAIN+RESERVED ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=main  BootTime=2026-12-01T06:10:09 "
    "SlurmdStartTime=2026-12-01T06:15:14 LastBusyTime=2026-12-01T06:15:14 "
    "CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=gpufleet: maintenance: swap PSU = now [root@2026-12-01T06:15:27]"
)
IDLE = "NodeName=node-b Arch=x86_64 Gres=(null) State=IDLE ThreadsPerCore=1 Partitions=main"
RESERVATION = (
    "ReservationName=gpufleet-rsv_d StartTime=2026-12-02T10:00:00 EndTime=2026-12-02T12:00:00 "
    "Duration=02:00:00 Nodes=node-a,gpu[01-02] NodeCnt=1 CoreCnt=2 Features=(null) "
    "PartitionName=(null) Flags=OVERLAP,SPEC_NODES TRES=cpu=2,gres/gpu:h100=4 Users=root,alice "
    "Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a "
    "MaxStartDelay=(null)"
)


def test_nodes_with_their_drain_reason_and_gpu_types() -> None:
    nodes = parse_nodes(NODE + "\n" + IDLE + "\n")
    a, b = nodes["node-a"], nodes["node-b"]
    assert a.drained and a.reason == "gpufleet: maintenance: swap PSU = now"
    assert a.drained_by_gpufleet and a.gpu_types == ("h100",)
    assert not b.drained and b.reason == "" and b.gpu_types == ()


def test_a_socket_per_gpu_gives_cores_per_gpu() -> None:
    """`slurm conf --socket-per-gpu` nodes (Sockets= the whole-GPU count) are what the
    `cores` mode reserves by; any other layout is 0 (reserved whole)."""
    line = ("NodeName=n CoresPerSocket={per} Gres=gpu:h100:6(S:0-7),gpu:h100_1g.10gb:7 "
            "Sockets={sockets} State=IDLE")  # fmt: skip
    assert parse_nodes(line.format(per=14, sockets=6))["n"].cores_per_gpu == 14
    assert parse_nodes(line.format(per=56, sockets=2))["n"].cores_per_gpu == 0
    assert parse_nodes(IDLE)["node-b"].cores_per_gpu == 0
    (r,) = parse_reservations(RESERVATION).values()
    assert r.core_total == 2


def test_reservations() -> None:
    (r,) = parse_reservations(RESERVATION).values()
    assert r.name == "gpufleet-rsv_d" and r.owned
    assert r.nodes == {"gpu01", "gpu02", "node-a"}
    assert r.start_s == parse_time("2026-12-02T10:00:00") and r.end_s - r.start_s == 7200
    assert r.users == {"root", "alice"} and r.accounts == frozenset()
    assert parse_reservations("No reservations in the system\n") == {}


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu-a", {"gpu-a"}),
        ("gpu[01-03,7]", {"gpu01", "gpu02", "gpu03", "gpu7"}),
        ("a[1-2]-x,b", {"a1-x", "a2-x", "b"}),
        ("(null)", set()),
    ],
)
def test_host_lists(text: str, names: set[str]) -> None:
    assert expand_hostlist(text) == names


def test_gpu_types() -> None:
    assert gpu_types("gpu:h100:8(S:0-1),gpu:a100:2,nic:1") == ("h100", "a100")
    assert gpu_types("gpu:4") == ()


def test_argv_of_each_action() -> None:
    now = parse_time("2026-12-01T06:00:00")
    want = SlurmReservation(
        "gpufleet-rsv_1", frozenset({"b", "a"}), now - 60, now + 3600, "gres/gpu:h100=4",
        users=frozenset({"root"}),
    )  # fmt: skip
    assert action_argv(CreateReservation(want), now) == [
        "create", "reservation", "ReservationName=gpufleet-rsv_1", "StartTime=now",
        "EndTime=2026-12-01T07:00:00", "Nodes=a,b", "TRES=gres/gpu:h100=4", "Users=root",
        "Flags=OVERLAP,IGNORE_JOBS",
    ]  # fmt: skip
    assert action_argv(UpdateReservation(want, ("end", "users")), now) == [
        "update", "ReservationName=gpufleet-rsv_1", "EndTime=2026-12-01T07:00:00",
        "Users=root", "Accounts=",
    ]  # fmt: skip
    assert action_argv(DeleteReservation("gpufleet-rsv_1"), now) == [
        "delete", "ReservationName=gpufleet-rsv_1",
    ]  # fmt: skip
    assert action_argv(Drain("a", "gpufleet: unreachable"), now) == [
        "update", "NodeName=a", "State=DRAIN", "Reason=gpufleet: unreachable",
    ]  # fmt: skip
    assert action_argv(Resume("a"), now) == ["update", "NodeName=a", "State=RESUME"]
    assert format_time(now) == "2026-12-01T06:00:00"
