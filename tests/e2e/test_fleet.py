"""End to end with real processes: nats-server, gpufleet-coordinator, gpufleet-agent, and
`gpufleet demo` as an operator would run them."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.kit.client import ApiClient, ApiError
from ops.kit.embedded_nats import EmbeddedNats, free_port
from ops.kit.keys import new_key
from tests.e2e.fleet_procs import BIN, stop, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def nats_proc(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as server:
        yield server


def test_agent_to_coordinator_to_capacity_summary_over_http(
    tmp_path: Path, nats_proc: EmbeddedNats
) -> None:
    port = free_port()
    operator_key = new_key()
    log = open(tmp_path / "coordinator.log", "wb")
    agent_log = open(tmp_path / "agent.log", "wb")
    argv = [
        str(BIN / "gpufleet-coordinator"),
        "--state-dir", str(tmp_path),
        "--nats-url", nats_proc.url,
        "--port", str(port),
    ]  # fmt: skip
    # The key in the environment, never on a command line (`ps` shows those).
    env = {**os.environ, "GPUFLEET_BOOTSTRAP_OPERATOR_KEY": operator_key}
    # This nats-server has no users: the coordinator refuses it unless told (exit 2).
    refused = subprocess.run(argv, capture_output=True, timeout=60, env=env)
    assert refused.returncode == 2, refused.stderr
    assert b"--insecure-bus" in refused.stderr
    coordinator = subprocess.Popen(
        [*argv, "--insecure-bus"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )  # fmt: skip
    agent: subprocess.Popen[bytes] | None = None
    try:
        url = f"http://127.0.0.1:{port}"
        op = ApiClient(url, operator_key)
        wait_for(op.healthy, what="coordinator up")
        op.call("tenants.create", {"tenantId": "acme"})
        pool = op.call(
            "pools.create", {"tenantId": "acme", "name": "east", "gpuModel": "H100 SXM"}
        )["poolId"]
        key = op.call("apiKeys.create", {"tenantId": "acme"})["key"]
        agent = subprocess.Popen(
            [
                str(BIN / "gpufleet-agent"),
                "--pool-id", pool,
                "--node-id", "h100-node-01",
                "--nats-url", nats_proc.url,
                "--simulate", "h100-sxm-8",
                "--interval", "1",
            ],
            stdout=agent_log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        tenant = ApiClient(url, key)

        def gpus() -> int:
            summary = tenant.call("capacity.summary", {"tenantId": "acme"})
            return int(summary["byGpuModel"].get("H100 SXM", {}).get("allocatable", 0))

        wait_for(lambda: gpus() == 8, what="8 allocatable H100s")
        rows = tenant.call("capacity.byPool", {"tenantId": "acme", "poolId": pool})["rows"]
        by = {r["resource"]: r for r in rows}
        assert by["node"]["total"] == 1
        assert by["gpu"]["total"] == 8
        assert by["vcpu"]["total"] > 0 and by["memoryGiB"]["total"] > 0
        with pytest.raises(ApiError) as denied:
            tenant.call("capacity.summary", {"tenantId": "someone-else"})
        assert denied.value.code == "PERMISSION_DENIED"
        assert stop(agent) == 0
        agent = None
        assert stop(coordinator) == 0
    finally:
        if agent is not None:
            stop(agent)
        if coordinator.poll() is None:
            stop(coordinator)
        log.close()
        agent_log.close()


def _demo_keys_stay_off_argv_and_its_exports_work(text: str, state: Path, pids: list[int]) -> None:
    """The keys reach no command line `ps` shows; the printed `export` line (also in
    demo.env, mode 0600) is all the CLI needs, alerts from NATS included."""
    (exports,) = [line.strip() for line in text.splitlines() if "export GPUFLEET_URL=" in line]
    env_file = state / "demo.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert exports in env_file.read_text().splitlines()
    env = dict(word.split("=", 1) for word in exports.split()[1:])
    assert {"GPUFLEET_URL", "GPUFLEET_KEY", "GPUFLEET_NATS_URL"} <= set(env), env
    keys = [line.split()[-1] for line in text.splitlines() if " key:" in line]
    assert len(keys) == 3 and env["GPUFLEET_KEY"] in keys, keys
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        assert not [k for k in keys if k in argv or k.split("_", 2)[2] in argv], argv
    cli_env = {"PATH": os.environ["PATH"], "HOME": str(state)} | env

    def gpufleet(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        ran = subprocess.run(
            [str(BIN / "gpufleet"), *args], capture_output=True, text=True, timeout=60,
            env=cli_env | extra,
        )  # fmt: skip
        assert "Traceback" not in ran.stderr, ran.stderr
        return ran

    # The printed agent commands run as they are: the config names the state dir.
    (bookings,) = [line.split() for line in text.splitlines() if "gpufleet-agent bookings" in line]
    ran = subprocess.run(
        [str(BIN / "gpufleet-agent"), *bookings[1:]], capture_output=True, text=True,
        timeout=60, env={"PATH": os.environ["PATH"], "HOME": str(state)},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    (env_cmd,) = [line.split() for line in text.splitlines() if "gpufleet-agent env" in line]
    assert env_cmd[2:] == ["RSV_ID", "--config", bookings[-1]], env_cmd

    pools = gpufleet("pools")
    assert pools.returncode == 0 and "h100-east" in pools.stdout, pools.stderr
    alerts = gpufleet("alerts", "watch", "--since", "-1h", "--count", "1", "--idle", "20")
    assert alerts.returncode == 0 and '"kind": "node.' in alerts.stdout, alerts.stderr
    # Without the exported NATS credentials the server refuses: said in one line.
    anonymous = gpufleet("alerts", "watch", "--idle", "5", GPUFLEET_NATS_CREDENTIALS="")
    assert anonymous.returncode == 1 and "Authorization Violation" in anonymous.stderr
    assert len(anonymous.stderr.strip().splitlines()) == 1, anonymous.stderr


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces; the fields after its ")" are fixed.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_demo_prints_a_capacity_table_and_stops_every_child_on_ctrl_c(tmp_path: Path) -> None:
    state = tmp_path / "demo-state"
    demo = subprocess.Popen(
        [str(BIN / "gpufleet"), "demo", "--state-dir", str(state), "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert demo.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = demo.stdout.readline().decode()
            if not line:
                break
            lines.append(line)
            if "Press Ctrl-C" in line:
                break
        text = "".join(lines)
        assert "Press Ctrl-C" in text, text
        assert "acme key:" in text and "gpf_" in text
        # The console's URL is printed, and it is the console (the sign-in page).
        url = re.search(r"^  console: +(http://\S+/)", text, re.M)
        assert url, text
        with urllib.request.urlopen(url.group(1), timeout=10) as resp:
            assert 'id="signin-form"' in resp.read().decode()
        assert "NVIDIA H100 80GB HBM3" in text and "total=16" in text
        # The demo books capacity and injects a fault; the table shows both.
        assert "4 NVLink-connected GPUs" in text
        # Promise against use: a workload under its booking, a pod with none, an idle one.
        assert re.search(
            r"a workload runs under rsv_\w+ on h100-\w GPU \d: the ledger sees 85% SM", text
        )
        assert "with no booking: the coordinator says gpu.unbookedUse" in text, text
        assert re.search(r"rsv_\w+ holds \S+ with nothing running: reservation.idle", text)
        # Chargeback (issue 35): a small bill of the bookings so far.
        assert re.search(r"acme's bill so far: [\d.]+ GPU-hours booked, [\d.]+ used", text), text
        assert "moved that GPU to the unhealthy bucket" in text
        assert "is at risk (unhealthy: h100-b:gpu:" in text  # the booking on that GPU
        # 16 GPUs, one unhealthy; 4 booked now and 8 from the next hour. The faulted GPU
        # holds one of those bookings, and a booking on an atom outside the allocatable
        # bucket is not counted (SPEC §2: its reservation is at risk): 15 - 11 = 4.
        assert "allocatable=15 available=4" in text
        # Secure by default: the demo's NATS demands credentials (its INFO says so before
        # anyone can publish), and each agent has a user of its own, private files.
        found = re.search(r"NATS:\s+nats://127\.0\.0\.1:(\d+)", text)
        assert found is not None, text
        with socket.create_connection(("127.0.0.1", int(found[1])), timeout=5) as bus:
            info = bus.makefile("rb").readline().decode()
        assert info.startswith("INFO "), info
        assert json.loads(info[5:]).get("auth_required") is True, info
        creds = state / "nats-auth" / "creds"
        agents = sorted(p.name for p in creds.glob("agent-*.creds"))
        nodes = ("h100-a", "h100-b", "a100-a", "l40s-a")
        assert sorted(n for n in nodes for a in agents if a.endswith(f"-{n}.creds")) == sorted(
            nodes
        ), agents
        assert len(agents) == len(nodes), agents
        assert all((creds / name).stat().st_mode & 0o077 == 0 for name in agents)
        # Four agents, a coordinator and nats-server.
        children = _children_of(demo.pid)
        assert len(children) == 6, children
        _demo_keys_stay_off_argv_and_its_exports_work(text, state, [demo.pid, *children])
        demo.send_signal(signal.SIGINT)
        rest = demo.stdout.read().decode()
        assert demo.wait(30) == 0
        assert "every child process has exited" in rest
        assert [pid for pid in children if _alive(pid)] == []
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        demo.stdout.close()


def _booked(text: str) -> list[str]:
    return re.findall(r"^  booked (\S+):", text, re.M)


def test_the_demo_reruns_on_its_kept_state_dir_with_private_files(tmp_path: Path) -> None:
    """The README offers `--state-dir` to keep the demo: a second run reuses the tenants,
    pools, keys and bookings the first made (it once exited 1 on its own booking's
    idempotency key). Under `--duration` nothing waits for Ctrl-C, so none is asked for.
    Everything it writes (the ledger, the logs) is the owner's alone."""
    state = tmp_path / "demo-state"
    runs = []
    for _ in range(2):
        ran = subprocess.run(
            [str(BIN / "gpufleet"), "demo", "--state-dir", str(state), "--interval", "1",
             "--duration", "1"],
            capture_output=True, text=True, timeout=110,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "gpufleet demo is running" in ran.stdout, ran.stdout
        assert "Ctrl-C" not in ran.stdout
        assert "every child process has exited" in ran.stdout
        runs.append(ran.stdout)
    first, second = runs
    assert len(_booked(first)) == 2 and _booked(second) == _booked(first)
    keys = [re.findall(r"^  (\w+) key: +(\S+)$", text, re.M) for text in runs]
    assert keys[1] == keys[0] and len(keys[0]) == 3
    pools = [re.findall(r"\b(pool_\w+)", text) for text in runs]
    assert set(pools[1]) == set(pools[0]) != set()
    assert state.stat().st_mode & 0o777 == 0o700
    files = [p for p in state.rglob("*") if p.is_file()]
    assert {"gpufleet.db", "coordinator.log", "nats.log", "agent-h100-a.log"} <= {
        p.name for p in files
    }
    assert [str(p) for p in files if p.stat().st_mode & 0o077] == []
