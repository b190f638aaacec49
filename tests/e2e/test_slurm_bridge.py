"""`gpufleet-slurm-bridge` against a real Slurm (tests/slurm_cluster.py: munged,
slurmctld, a slurmd per node on loopback) and a real fleet (nats-server,
gpufleet-coordinator, simulated agents whose node ids are the Slurm nodes'), all
processes: each booking, renewal, release, maintenance, unhealthy and unreachable change
shows in `scontrol show reservation` and `sinfo` within seconds; a job with
`--reservation` runs on the booked node and one without cannot take it; a hand-made
reservation and drain survive; the bridge killed with SIGKILL mid-stream and restarted
loses and duplicates nothing; events alone trigger a pass.

Slurm 22.05 cannot reserve GRES, with slurmdbd or without ("TRES type 'gres/gpu:h100'
not supported with reservations"; tests/e2e/test_slurm_accounting.py), so the main test
runs the bridge with `--gpu-tres off`: a booked node is reserved whole. The default,
`auto`, is shown to fall back to that on such a Slurm (and to keep GPU TRES where Slurm
takes them); the TRES form is the planner's (tests/unit/ops/slurm/test_planner.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from agent.sim.faults import write_faults
from ops.kit.embedded_nats import EmbeddedNats, free_port
from ops.slurm.bridge.daemon import ACK_WAIT_S
from ops.slurm.bridge.scontrol import parse_time
from shared.streams import stream_name
from tests.e2e.fleet_procs import BIN, Fleet, stop, wait_for
from tests.slurm_accounting import gres_reservations_refused, require_slurmdbd
from tests.slurm_cluster import SlurmCluster, SlurmConfig, node_line

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
SLURM_NODES = ("sim-a", "sim-b", "other")  # `other` is Slurm's alone
MODE = "gpufleet_slurm_bridge_gpu_tres_mode"
MECHANISM = "gpufleet_slurm_bridge_mechanism"
WITHIN_S = 10.0  # "within seconds": two resync intervals and the detection window


@pytest.fixture
def nats_proc(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as server:
        yield server


class Bridge:
    def __init__(self, fleet: Fleet, cluster: SlurmCluster, workdir: Path) -> None:
        self.metrics_port = free_port()
        self.argv = [
            str(BIN / "gpufleet-slurm-bridge"),
            "--coordinator-url", fleet.url, "--nats-url", fleet.nats_url,
            "--slurm-conf", str(cluster.conf_path), "--user", "acme=root",
            "--resync-interval-s", "1", "--fetch-wait-s", "0.2",
            "--metrics-port", str(self.metrics_port), "--unreachable-grace-s", "1",
        ]  # fmt: skip
        self.fleet = fleet
        self.env = dict(os.environ)
        self.log = open(workdir / "bridge.log", "ab")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if "GPUFLEET_SLURM_BRIDGE_KEY" not in self.env:
            # An observer key, as docs/operator.md gives the bridge: it reads, never writes.
            observer = self.fleet.operator().call(
                "apiKeys.create", {"tenantId": "operator", "roles": ["observer"], "label": "bridge"}
            )
            self.env["GPUFLEET_SLURM_BRIDGE_KEY"] = observer["key"]
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=self.log, stderr=subprocess.STDOUT
        )
        wait_for(lambda: self.metric("gpufleet_slurm_bridge_reconciles_total") > 0,
                 timeout=30, what="the bridge's first pass")  # fmt: skip

    def metric(self, name: str, **labels: str) -> float:
        want = name + (
            "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
        )
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return 0.0
        for line in text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return 0.0

    def close(self, sig: int = signal.SIGTERM) -> int | None:
        rc = None
        if self.proc is not None:
            rc = stop(self.proc, sig)
            self.proc = None
        return rc


def _cluster(cluster: SlurmCluster) -> SlurmCluster:
    dev = cluster.dev_dir
    gres = "\n".join(
        f"NodeName={n} Name=gpu Type=h100 File={dev}/nvidia[{8 * i}-{8 * i + 7}]"
        for i, n in enumerate(SLURM_NODES)
    )
    return cluster.start(
        SlurmConfig(
            nodes=[node_line(n, gres="gpu:h100:8", cpus=2) for n in SLURM_NODES],
            gres_conf=gres + "\n",
        )
    )


def _eventually(check: Callable[[], bool], what: str, within_s: float = WITHIN_S) -> None:
    wait_for(check, timeout=within_s, what=what)


def _book(op: Any, pool: str, key: str, **extra: Any) -> dict[str, Any]:
    body = {
        "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 2}],
        "duration": "1h", "idempotencyKey": key,
    } | extra  # fmt: skip
    out: dict[str, Any] = op.call("reservations.create", body)
    return out


def _slurm_name(rsv: dict[str, Any]) -> str:
    return "gpufleet-" + str(rsv["reservationId"])


def _booked_node(rsv: dict[str, Any]) -> str:
    (node,) = {a["nodeId"] for a in rsv["atoms"]}
    return str(node)


def _consumer_settled(nats_url: str) -> bool:
    """The bridge's durable consumer has nothing pending or unacknowledged."""

    async def check() -> bool:
        nc = await nats.connect(nats_url)
        try:
            info = await nc.jetstream().consumer_info(stream_name("gpufleet"), "slurm-bridge")
            return info.num_pending == 0 and info.num_ack_pending == 0
        finally:
            await nc.close()

    return asyncio.run(check())


def test_bridge_keeps_slurm_in_step_with_the_ledger(
    tmp_path: Path, nats_proc: EmbeddedNats, slurm_cluster: SlurmCluster
) -> None:
    cluster = _cluster(slurm_cluster)
    fleet = Fleet(tmp_path, nats_proc.url)
    bridge = Bridge(fleet, cluster, tmp_path)
    bridge.argv += ["--gpu-tres", "off"]  # whole nodes from the first pass
    faults = tmp_path / "faults-sim-b.json"
    write_faults(faults, [])
    try:
        fleet.start_coordinator("--recovery-hold-s", "0.5")
        op = fleet.operator()
        op.call("tenants.create", {"tenantId": "acme"})
        pool = op.call("pools.create", {"tenantId": "acme", "name": "p", "gpuModel": "H100"})
        pool_id = pool["poolId"]
        # ghost: a node Slurm does not know, in a pool of its own (no booking lands there)
        other_pool = op.call("pools.create", {"tenantId": "acme", "name": "q"})["poolId"]
        fleet.start_agent("ghost", other_pool, "h100-sxm-8", 1.0)
        fleet.start_agent("sim-a", pool_id, "h100-sxm-8", 1.0)
        agent_conf = tmp_path / "agent-sim-b.toml"
        agent_conf.write_text("[health]\nrecover_after_s = 0.5\n")  # a reset clears at once
        fleet.start_agent("sim-b", pool_id, "h100-sxm-8", 1.0, "--fault-file", str(faults),
                          "--config", str(agent_conf))  # fmt: skip
        wait_for(lambda: len(op.call("nodes.list", {})["nodes"]) == 3, what="3 nodes")

        # Before the bridge starts: a booking, stale gpufleet objects, hand-made ones.
        first = _book(op, pool_id, "k1")
        cluster.scontrol(
            "create", "reservation", "ReservationName=gpufleet-rsv_stale", "Nodes=other",
            "Users=root", "StartTime=now", "Duration=60", "Flags=OVERLAP",
        )  # fmt: skip
        cluster.scontrol(
            "create", "reservation", "ReservationName=maint-window", "Nodes=other",
            "Users=root", "StartTime=now", "Duration=60", "Flags=OVERLAP",
        )  # fmt: skip
        cluster.scontrol("update", "NodeName=other", "State=DRAIN", "Reason=bad fan")
        cluster.scontrol("update", "NodeName=sim-a", "State=DRAIN",
                         "Reason=gpufleet: maintenance: long ago")  # fmt: skip
        op.call("nodes.setMaintenance", {"nodeId": "ghost", "maintenance": True, "reason": "x"})

        bridge.start()
        held = cluster.reservations()
        assert set(held) == {_slurm_name(first), "maint-window"}  # the stale one is gone
        mine = held[_slurm_name(first)]
        assert mine["Nodes"] == _booked_node(first) and mine["Users"] == "root"
        assert abs(_end_s(mine) - first["end"] // 1000) <= 1
        # A gpufleet drain the ledger does not back is lifted: sim-a is idle, or "resv"
        # when the first booking landed there (a node in a live reservation).
        lifted = "resv" if _booked_node(first) == "sim-a" else "idle"
        cluster.wait_nodes(["sim-a"], lifted)
        assert cluster.node_states()["other"].startswith("drain")  # hand-made: kept
        assert cluster.node("other")["Reason"].startswith("bad fan")
        assert bridge.metric("gpufleet_slurm_bridge_unknown_nodes") == 1  # ghost

        # A job with the reservation runs on the booked node; one without cannot take it.
        node = _booked_node(first)
        inside = cluster.srun(f"--reservation={_slurm_name(first)}", "--gres=gpu:h100:1",
                              "printenv", "SLURMD_NODENAME")  # fmt: skip
        assert inside.returncode == 0 and inside.stdout.strip() == node, inside.stderr
        outside = cluster.srun("-w", node, "--gres=gpu:h100:1", "--immediate=3", "true")
        assert outside.returncode != 0

        # Renew moves EndTime; release deletes it.
        leased = _book(op, pool_id, "k2", leaseSeconds=600)
        name = _slurm_name(leased)
        _eventually(lambda: name in cluster.reservations(), "the leased booking in Slurm")
        assert abs(_end_s(cluster.reservations()[name]) - leased["leaseExpiresAt"] // 1000) <= 1
        renew = {"tenantId": "acme", "reservationId": leased["reservationId"], "leaseSeconds": 1800}
        renewed = op.call("reservations.renew", renew)
        _eventually(
            lambda: (
                abs(_end_s(cluster.reservations()[name]) - renewed["leaseExpiresAt"] // 1000) <= 1
            ),
            "the renewal in Slurm",
        )
        later = _book(op, pool_id, "k5", start=int(time.time() * 1000) + 3_600_000)
        _eventually(lambda: _slurm_name(later) in cluster.reservations(), "a scheduled booking")
        scheduled = cluster.reservations()[_slurm_name(later)]
        assert parse_time(scheduled["StartTime"]) == later["start"] // 1000
        assert scheduled["State"] == "INACTIVE"
        release = {"tenantId": "acme", "reservationId": first["reservationId"]}
        op.call("reservations.release", release)
        _eventually(lambda: _slurm_name(first) not in cluster.reservations(), "the release")

        # Maintenance and its end; unhealthy and its end.
        op.call("nodes.setMaintenance", {"nodeId": "sim-a", "maintenance": True, "reason": "PSU"})
        _eventually(lambda: _drained(cluster, "sim-a", "gpufleet: maintenance: PSU"), "drain")
        op.call("nodes.setMaintenance", {"nodeId": "sim-a", "maintenance": False})
        _eventually(lambda: _open(cluster, "sim-a"), "resume after maintenance")
        write_faults(faults, [{"kind": "nvml_down"}])
        _eventually(lambda: _drained(cluster, "sim-b", "gpufleet: unhealthy"), "unhealthy drain")
        write_faults(faults, [])
        _eventually(lambda: _open(cluster, "sim-b"), "resume after recovery", within_s=30)
        # One dead GPU (XID 79: the node only degraded) drains the node, the GPU named;
        # a reset clears it and the node is resumed.
        write_faults(faults, [{"kind": "xid", "gpu": 3, "xid": 79}])
        _eventually(lambda: _drained(cluster, "sim-b", "gpufleet: unhealthy: GPU3 xid 79"),
                    "drain on one unhealthy GPU")  # fmt: skip
        write_faults(faults, [{"kind": "reset", "gpu": 3}])
        _eventually(lambda: _open(cluster, "sim-b"), "resume after the reset", within_s=30)
        write_faults(faults, [])

        # Killed mid-stream: events and bookings while it is down are neither lost nor doubled.
        op.call("nodes.setMaintenance", {"nodeId": "sim-a", "maintenance": True, "reason": "k"})
        third = _book(op, pool_id, "k3")
        bridge.close(signal.SIGKILL)
        op.call("nodes.setMaintenance", {"nodeId": "sim-a", "maintenance": False})
        op.call("nodes.setMaintenance", {"nodeId": "sim-b", "maintenance": True, "reason": "m"})
        fourth = _book(op, pool_id, "k4")
        bridge.start()
        _eventually(lambda: _drained(cluster, "sim-b", "gpufleet: maintenance: m"), "sim-b")
        live = {_slurm_name(r) for r in (leased, later, third, fourth)}
        assert {n for n in cluster.reservations() if n.startswith("gpufleet-")} == live
        # An scontrol the killed bridge left running (its drain of sim-a) may land after
        # the new bridge read Slurm: the next pass resumes it.
        _eventually(lambda: _open(cluster, "sim-a"), "sim-a resumed")
        assert "maint-window" in cluster.reservations()
        # What the killed bridge held comes back after the ack wait (ACK_WAIT_S).
        _eventually(lambda: _consumer_settled(fleet.nats_url), "every event acknowledged",
                    within_s=ACK_WAIT_S + WITHIN_S)  # fmt: skip
        assert bridge.metric("gpufleet_slurm_bridge_failures_total", kind="node.drain") == 0
        assert bridge.metric("gpufleet_slurm_bridge_lag_seconds") < WITHIN_S

        # Events trigger: with no resync for a minute, a maintenance event still drains
        # within seconds. Changes Slurm refuses (GPU TRES on 22.05) are counted,
        # hold the lag, and stop nothing else.
        assert bridge.close() == 0  # SIGTERM: a clean stop
        bridge.argv += ["--resync-interval-s", "60", "--gpu-tres", "typed"]
        bridge.start()
        assert bridge.metric("gpufleet_slurm_bridge_failures_total", kind="reservation.update") > 0
        assert math.isnan(bridge.metric("gpufleet_slurm_bridge_lag_seconds"))
        # …and the log says what to do about it.
        assert 'or "off" (whole nodes)' in (tmp_path / "bridge.log").read_text()
        op.call("nodes.setMaintenance", {"nodeId": "sim-a", "maintenance": True, "reason": "ev"})
        _eventually(lambda: _drained(cluster, "sim-a", "gpufleet: maintenance: ev"), "event drain")
        # Unreachable outranks maintenance, as in the rollup: its event changes the reason.
        stop(fleet.agents["sim-b"])
        _eventually(lambda: _drained(cluster, "sim-b", "gpufleet: unreachable"), "unreachable",
                    within_s=15)  # fmt: skip
        assert {n for n in cluster.reservations() if n.startswith("gpufleet-")} == live
    finally:
        bridge.close()
        bridge.log.close()
        fleet.close()


@contextlib.contextmanager
def _one_node_fleet(
    tmp_path: Path, nats_proc: EmbeddedNats, cluster: SlurmCluster, *bridge_args: str
) -> Iterator[tuple[Bridge, Any, str]]:
    """A fleet whose one agent is Slurm's `sim-a` (8 H100), and a started bridge with
    `bridge_args`; yields the bridge, an operator client and the pool id."""
    fleet = Fleet(tmp_path, nats_proc.url)
    bridge = Bridge(fleet, cluster, tmp_path)
    bridge.argv += list(bridge_args)
    try:
        fleet.start_coordinator()
        op = fleet.operator()
        op.call("tenants.create", {"tenantId": "acme"})
        pool = op.call("pools.create", {"tenantId": "acme", "name": "p", "gpuModel": "H100"})
        fleet.start_agent("sim-a", pool["poolId"], "h100-sxm-8", 1.0)
        wait_for(lambda: len(op.call("nodes.list", {})["nodes"]) == 1, what="the node")
        bridge.start()
        yield bridge, op, pool["poolId"]
    finally:
        bridge.close()
        bridge.log.close()
        fleet.close()


def _one_node_cluster(slurm_cluster: SlurmCluster, slurmdbd: bool) -> SlurmCluster:
    dev = slurm_cluster.dev_dir
    return slurm_cluster.start(
        SlurmConfig(
            nodes=[node_line("sim-a", gres="gpu:h100:8", cpus=2)],
            gres_conf=f"NodeName=sim-a Name=gpu Type=h100 File={dev}/nvidia[0-7]\n",
            slurmdbd=slurmdbd,
            accounting_tres=("gres/gpu", "gres/gpu:h100") if slurmdbd else (),
        ),
        timeout_s=60,
    )


def test_bridge_reserves_only_the_booked_gpus_by_tres(
    tmp_path: Path, nats_proc: EmbeddedNats, slurm_cluster: SlurmCluster
) -> None:
    """GPU mode (`--gpu-tres typed`, slurmdbd, AccountingStorageTRES naming the gres): a
    booking of 4 of 8 GPUs is a reservation of those 4 by TRES; the other 4, and no
    more, stay open to jobs outside it. On a Slurm that cannot reserve GRES (before
    23.11) it checks the bridge's side only, that it asked for exactly those GPUs and
    logged why Slurm refused, then skips."""
    require_slurmdbd()
    cluster = _one_node_cluster(slurm_cluster, slurmdbd=True)
    refused = gres_reservations_refused(cluster, "sim-a", "gres/gpu:h100=4")
    assert not refused or "not supported with reservations" in refused, refused
    with _one_node_fleet(tmp_path, nats_proc, cluster, "--gpu-tres", "typed") as (
        bridge, op, pool_id,
    ):  # fmt: skip
        four = _book(op, pool_id, "t4", devices=[{"class": "gpu", "count": 4}])
        name = _slurm_name(four)
        if refused:
            failures = "gpufleet_slurm_bridge_failures_total"
            _eventually(lambda: bridge.metric(failures, kind="reservation.create") > 0,
                        "the refusal")  # fmt: skip
            log = (tmp_path / "bridge.log").read_text()
            assert re.search(rf"create reservation ReservationName={name} .*"
                             r"Nodes=sim-a TRES=gres/gpu:h100=4 ", log), log  # fmt: skip
            assert "this Slurm cannot reserve GPUs" in log
            assert name not in cluster.reservations()
            assert bridge.metric(MODE, mode="typed") == 1  # explicit: never falls back
            pytest.skip(f"{refused}; the bridge's side holds")
        _eventually(lambda: name in cluster.reservations(), "the booking in Slurm")
        held = cluster.reservations()[name]
        assert held["Nodes"] == "sim-a" and "gres/gpu:h100=4" in held["TRES"].split(",")

        inside = cluster.srun(f"--reservation={name}", "--gres=gpu:h100:4", "true")
        assert inside.returncode == 0, inside.stderr
        outside = cluster.srun("-w", "sim-a", "--gres=gpu:h100:4", "--immediate=5", "true")
        assert outside.returncode == 0, outside.stderr
        fifth = cluster.srun("-w", "sim-a", "--gres=gpu:h100:5", "--immediate=3", "true")
        assert fifth.returncode != 0
        assert bridge.metric("gpufleet_slurm_bridge_failures_total",
                             kind="reservation.create") == 0  # fmt: skip


@pytest.mark.parametrize("slurmdbd", [False, True], ids=["no-slurmdbd", "slurmdbd"])
def test_auto_mode_protects_a_booking_on_any_slurm(
    tmp_path: Path, nats_proc: EmbeddedNats, slurm_cluster: SlurmCluster, slurmdbd: bool
) -> None:
    """The default (`gpu_tres = "auto"`): a booking of 4 of 8 GPUs is always reserved in
    Slurm. Where Slurm refuses GRES in reservations (before 23.11, or no slurmdbd /
    AccountingStorageTRES) the bridge falls back to the booked node whole, says so once
    in its log and in gpufleet_slurm_bridge_gpu_tres_mode, and a job without the
    reservation cannot run there; where Slurm takes them, only the 4 GPUs are held.
    With slurmdbd each booking also gets its QOS (`nodes+qos` in the log and
    gpufleet_slurm_bridge_mechanism), removed at its release."""
    if slurmdbd:
        require_slurmdbd()
    cluster = _one_node_cluster(slurm_cluster, slurmdbd)
    refused = gres_reservations_refused(cluster, "sim-a", "gres/gpu:h100=4")
    with _one_node_fleet(tmp_path, nats_proc, cluster) as (bridge, op, pool_id):
        four = _book(op, pool_id, "a4", devices=[{"class": "gpu", "count": 4}])
        name = _slurm_name(four)
        _eventually(lambda: name in cluster.reservations(), "the booking in Slurm")
        held = cluster.reservations()[name]
        assert held["Nodes"] == "sim-a"
        inside = cluster.srun(f"--reservation={name}", "--gres=gpu:h100:4", "true")
        assert inside.returncode == 0, inside.stderr
        outside = cluster.srun("-w", "sim-a", "--gres=gpu:h100:1", "--immediate=3", "true")
        qos = "+qos" if slurmdbd else ""
        if slurmdbd:
            assert _qos(cluster, name) == "gres/gpu:h100=4,gres/gpu=4|gpufleet booking"
        if not refused:  # Slurm 23.11+ with accounting: GPU-level, no fallback
            assert "gres/gpu:h100=4" in held["TRES"].split(",")
            assert outside.returncode == 0, outside.stderr
            assert bridge.metric(MODE, mode="typed") == 1
            assert bridge.metric(MECHANISM, mechanism="gres" + qos) == 1
            return
        assert "gres/gpu" not in held.get("TRES", ""), held  # the node whole
        assert outside.returncode != 0
        assert bridge.metric(MODE, mode="off") == 1 and bridge.metric(MODE, mode="typed") == 0
        assert bridge.metric(MECHANISM, mechanism="nodes" + qos) == 1
        log = (tmp_path / "bridge.log").read_text()
        assert log.count('gpu_tres = "auto": Slurm refused GPUs') == 1, log
        assert f"holding bookings by nodes{qos}:" in log, log
        # A second booking goes straight to a whole-node reservation: no new refusal.
        failures = bridge.metric("gpufleet_slurm_bridge_failures_total",
                                 kind="reservation.create")  # fmt: skip
        two = _book(op, pool_id, "a2")
        _eventually(lambda: _slurm_name(two) in cluster.reservations(), "the second booking")
        assert bridge.metric("gpufleet_slurm_bridge_failures_total",
                             kind="reservation.create") == failures  # fmt: skip
        if slurmdbd:
            op.call("reservations.release",
                    {"tenantId": "acme", "reservationId": four["reservationId"]})  # fmt: skip
            _eventually(lambda: not _qos(cluster, name), "the released booking's QOS gone")
            assert _qos(cluster, _slurm_name(two)) == "gres/gpu:h100=2,gres/gpu=2|gpufleet booking"


def _qos(cluster: SlurmCluster, name: str) -> str:
    """A QOS's `GrpTRES|Description` as sacctmgr shows it; empty when there is none."""
    out = cluster.run("sacctmgr", "-n", "-P", "show", "qos", f"name={name.lower()}",
                      "format=grptres,description").stdout  # fmt: skip
    return out.strip()


def _end_s(record: dict[str, str]) -> int:
    return parse_time(record["EndTime"])


def _drained(cluster: SlurmCluster, node: str, reason: str) -> bool:
    return cluster.node_states()[node].startswith("drain") and cluster.node(node).get(
        "Reason", ""
    ).startswith(reason)


def _open(cluster: SlurmCluster, node: str) -> bool:
    """Not drained (idle, or reserved for a booking)."""
    return cluster.node_states()[node] in ("idle", "resv", "mix", "alloc")
