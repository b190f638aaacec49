"""Agent footprint benchmark: RSS and CPU of a simulated 8-GPU agent against a real
nats-server (SPEC §8: < 1 % of one core at the default interval; issue 30: steady RSS
< 30 MB and peak RSS, start-up included, < 40 MB).

Builds the venv a GPU host gets, the way the gpufleet_agent role builds it: `python -m
venv`, the role's locked requirements (exported from uv.lock) with `--require-hashes`,
then gpufleet[agent] from this checkout with `--no-deps`, all by pip from PyPI or its
cache. pip compiles bytecode as it installs; on a host the service user cannot write
`__pycache__`, so that is the only bytecode the agent ever has.

Runs the venv's `gpufleet-agent --simulate h100-sxm-8` for N seconds at each interval
with 16 simulated workloads (two processes per GPU, owners from the environment,
Kubernetes, Slurm, a container and systemd; constant, ramp and square utilization
curves: issue 24's "8 GPUs and 16 processes"), counts its heartbeats and their largest
size, its UseReports, samples its RSS and CPU time from /proc. Steady RSS is the largest
sample after the first heartbeat; peak is the kernel's high-water mark (VmHWM), which
includes start-up. The baseline, measured in the same run: a bare Python process of the
same venv that imports the agent's modules and sleeps.

Two contrasts at the first interval, reported beside the goals (the "before"): the same
venv without its bytecode (every module compiled at each start: an install that skipped
compiling, run by a user who cannot write it), and the same venv once aiohttp is
importable (a shared venv: nats-py imports aiohttp whenever it can; the agent, on its
own client, `procs/natsproto`, no longer loads nats-py, and that row shows it stays
so). Prints a table and writes bench/results/agent.json.

    .venv/bin/python bench/agent_bench.py [--seconds 30] [--intervals 5,0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import Goal, write

from ops.kit.embedded_nats import EmbeddedNats
from shared.ids import new_pool_id

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
ROLES = ROOT / "ansible" / "roles"
# What the gpufleet_agent role installs: the lock's export for the agent extra.
REQUIREMENTS = ROLES / "gpufleet_agent" / "files" / "requirements.txt"
GOAL_STEADY_MB, GOAL_PEAK_MB = 30, 40
# What the agent process imports when it runs `--simulate` (the NVML side included).
BASELINE = (
    "import time; "
    "import agent.main, agent.publisher, agent.poller, agent.reader, agent.xid_watch, "
    "agent.sim.nvml; print('ready', flush=True); time.sleep(3600)"
)


def workloads(count: int = 16, gpus: int = 8) -> list[dict[str, Any]]:
    """`count` processes spread over `gpus` GPUs, one owner kind and curve after another."""
    pod = "1234abcd-5678-90ab-cdef-{:012x}"
    cgroups = [
        "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-" + "a" * 64 + ".scope",
        "0::/system.slice/slurmstepd.scope/job_{}/step_0/user/task_0",
        "0::/system.slice/docker-" + "c" * 64 + ".scope",
        "0::/system.slice/trainer-{}.service",
    ]
    curves: list[dict[str, Any]] = [
        {"shape": "constant", "level": 80},
        {"shape": "ramp", "from": 0, "to": 100, "period_s": 120},
        {"shape": "square", "low": 5, "high": 95, "period_s": 30, "duty": 0.5},
    ]
    out: list[dict[str, Any]] = []
    for k in range(count):
        entry: dict[str, Any] = {
            "kind": "process",
            "pid": 10_000 + k,
            "gpu": k % gpus,
            "memory_mib": 4096 * (1 + k % 4),
            "util": curves[k % len(curves)],
        }
        if k % 5 == 0:
            entry["env"] = {"GPUFLEET_RESERVATION_ID": f"rsv_01jbench{k:018d}"}
        else:
            uid = pod.format(k).replace("-", "_")
            entry["cgroup"] = cgroups[k % len(cgroups)].format(uid if k % 4 == 0 else k)
        out.append(entry)
    return out


def proc_status_mb(pid: int, key: str) -> float:
    """A `kB` line of /proc/<pid>/status in MB: VmRSS now, VmHWM the largest ever."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def uss_mb(pid: int) -> float:
    """Memory private to the process: RSS minus library pages shared with others."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total / 1024


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _pip(venv: Path, *args: str) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args]
    subprocess.run(cmd, check=True, timeout=600, env=env)


def _tree_copy(dest: Path) -> Path:
    """This checkout's files (tracked, and new ones not ignored) copied to `dest`: pip
    builds a local project in place and would leave build/ in the checkout."""
    git = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(git, cwd=ROOT, capture_output=True, check=True, timeout=60)
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def host_venv(dest: Path) -> Path:
    """The venv the gpufleet_agent role builds (tasks/main.yml), at `dest`."""
    python = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(python), "-m", "venv", str(dest)], check=True, timeout=120)
    _pip(dest, "--require-hashes", "-r", str(REQUIREMENTS))
    src = _tree_copy(dest.parent / "src")
    _pip(dest, "--no-deps", f"{src}[agent]")
    return dest


def strip_bytecode(venv: Path) -> None:
    for cache in venv.rglob("__pycache__"):
        shutil.rmtree(cache)


def compile_bytecode(venv: Path) -> None:
    """What pip does when it installs: bytecode next to every module of site-packages."""
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    subprocess.run([str(python), "-m", "compileall", "-q", purelib], check=True, timeout=600)


def add_aiohttp(venv: Path) -> str:
    """Install the locked aiohttp (what a shared venv with the coordinator holds)."""
    locked = (ROLES / "gpufleet_coordinator" / "files" / "requirements.txt").read_text()
    pin = next(line.split()[0] for line in locked.splitlines() if line.startswith("aiohttp=="))
    _pip(venv, pin)
    return pin


def _quiet_env(**extra: str) -> dict[str, str]:
    # The bench's own environment may say PYTHONDONTWRITEBYTECODE; a host's does not,
    # and the venv is read-only to the agent there anyway.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return {**env, "GPUFLEET_LOG_LEVEL": "WARNING", **extra}


async def measure_baseline(venv: Path, cwd: Path) -> dict[str, float]:
    proc = await asyncio.create_subprocess_exec(
        venv / "bin" / "python", "-c", BASELINE, stdout=asyncio.subprocess.PIPE, cwd=cwd,
        env=_quiet_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), 60)
        return {
            "rssMB": round(proc_status_mb(proc.pid, "VmRSS"), 2),
            "ussMB": round(uss_mb(proc.pid), 2),
        }
    finally:
        proc.terminate()
        await proc.wait()


async def measure_agent(
    venv: Path, url: str, interval: float, seconds: float, faults: Path, **env: str
) -> dict[str, Any]:
    pool, node = new_pool_id(), "bench-node"
    nc = await nats.connect(url)
    beats = reports = largest = inline = 0
    first = asyncio.Event()

    async def count(msg: Any) -> None:
        nonlocal beats, largest, inline
        beats += 1
        largest = max(largest, len(msg.data))
        inline += b'"use":[]' not in msg.data
        first.set()

    async def count_use(_msg: Any) -> None:
        nonlocal reports
        reports += 1

    await nc.subscribe(f"gpufleet.hb.{pool}.{node}", cb=count)
    await nc.subscribe(f"gpufleet.use.{pool}.{node}", cb=count_use)
    # The command the systemd unit runs, from a directory outside the checkout.
    cmd = [str(venv / "bin" / "gpufleet-agent"), "--pool-id", pool, "--node-id", node]
    cmd += ["--nats-url", url, "--simulate", "h100-sxm-8", "--interval", str(interval)]
    cmd += ["--fault-file", str(faults)]
    proc = await asyncio.create_subprocess_exec(
        *cmd, stderr=asyncio.subprocess.DEVNULL, cwd=faults.parent, env=_quiet_env(**env)
    )
    try:
        # Imports and the first poll are not steady state: start counting after them.
        await asyncio.wait_for(first.wait(), 60)
        start_cpu, start_beats, start = cpu_s(proc.pid), beats, time.monotonic()
        steady = proc_status_mb(proc.pid, "VmRSS")
        while time.monotonic() - start < seconds:
            await asyncio.sleep(min(1.0, seconds / 10))
            steady = max(steady, proc_status_mb(proc.pid, "VmRSS"))
        used, elapsed = cpu_s(proc.pid) - start_cpu, time.monotonic() - start
        polls = beats - start_beats
        uss, peak = uss_mb(proc.pid), proc_status_mb(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        await proc.wait()
        await nc.close()
    return {
        "intervalS": interval,
        "seconds": round(elapsed, 2),
        "heartbeats": polls,
        "rssMB": round(steady, 2),
        "peakMB": round(peak, 2),
        "ussMB": round(uss, 2),
        "cpuPercent": round(100 * used / elapsed, 3),
        "cpuMsPerPoll": round(1000 * used / polls, 3) if polls else None,
        "largestHeartbeatBytes": largest,
        "heartbeatsWithUse": inline,
        "useReports": reports,
        "exitCode": proc.returncode,
    }


def print_rows(rows: list[dict[str, Any]]) -> None:
    head = ("venv", "interval s", "beats", "RSS MB", "peak MB", "xbase", "USS MB", "CPU %")
    line = "{:<22} {:>10} {:>6} {:>7} {:>7} {:>6} {:>7} {:>7} {:>8} {:>6} {:>4}"
    print(line.format(*head, "ms/poll", "max B", "rep"))
    for r in rows:
        cells: list[Any] = [r["venv"], r["intervalS"], r["heartbeats"], f"{r['rssMB']:.1f}"]
        cells += [f"{r['peakMB']:.1f}", r["rssVsBaseline"], f"{r['ussMB']:.1f}"]
        cells += [f"{r['cpuPercent']:.3f}", f"{r['cpuMsPerPoll'] or 0.0:.2f}"]
        cells += [r["largestHeartbeatBytes"], r["useReports"]]
        print(line.format(*cells))


def goals_for(rows: list[dict[str, Any]]) -> list[Goal]:
    goals = []
    for r in rows:
        if r["venv"] != "agent only":
            continue
        what = f"16 processes, {r['intervalS']:g} s interval"
        ratio = f"{r['rssVsBaseline']}x idle python with its imports"
        goals += [
            Goal(f"agent steady RSS, {what}", f"{r['rssMB']:.1f} MB", ratio,
                 f"< {GOAL_STEADY_MB} MB", r["rssMB"] < GOAL_STEADY_MB),
            Goal(f"agent peak RSS (VmHWM: start-up too), {what}", f"{r['peakMB']:.1f} MB",
                 "", f"< {GOAL_PEAK_MB} MB", r["peakMB"] < GOAL_PEAK_MB),
        ]  # fmt: skip
        if r["intervalS"] >= 5:  # the goal is for the default interval
            goals.append(
                Goal(
                    f"agent CPU, 16 processes, {r['intervalS']:g} s interval",
                    f"{r['cpuPercent']:.2f} % of a core", "", "< 1 %", r["cpuPercent"] < 1,
                )
            )  # fmt: skip
    return goals


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--intervals", default="5,0.5")
    args = parser.parse_args()
    intervals = [float(x) for x in args.intervals.split(",")]
    with tempfile.TemporaryDirectory(prefix="gpufleet-host-") as tmp:
        began = time.monotonic()
        venv = host_venv(Path(tmp) / "venv")
        print(f"built the agent's venv as the role does in {time.monotonic() - began:.0f} s")
        run = Path(tmp) / "run"
        run.mkdir()
        faults = run / "workloads.json"
        faults.write_text(json.dumps({"faults": workloads()}))
        baseline = await measure_baseline(venv, run)
        rows = []
        with EmbeddedNats() as server:
            for interval in intervals:
                row = await measure_agent(venv, server.url, interval, args.seconds, faults)
                rows.append({"venv": "agent only", **row})
            # The contrasts, at the first interval: what the goals would read elsewhere.
            short = min(args.seconds, 15.0)
            strip_bytecode(venv)
            row = await measure_agent(
                venv, server.url, intervals[0], short, faults, PYTHONDONTWRITEBYTECODE="1"
            )
            rows.append({"venv": "no bytecode", **row})
            compile_bytecode(venv)
            pin = add_aiohttp(venv)
            row = await measure_agent(venv, server.url, intervals[0], short, faults)
            rows.append({"venv": f"+ {pin}", **row})
    for row in rows:
        row["rssVsBaseline"] = round(row["rssMB"] / baseline["rssMB"], 2)
    print(
        f"baseline (python + the agent's imports, idle): RSS {baseline['rssMB']:.1f} MB, "
        f"USS {baseline['ussMB']:.1f} MB"
    )
    print_rows(rows)
    return write("agent", {"baseline": baseline, "runs": rows}, goals_for(rows))


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
