"""Starting and stopping real gpufleet processes for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

from ops.kit.client import ApiClient
from ops.kit.embedded_nats import free_port
from ops.kit.keys import new_key

BIN = Path(sys.executable).parent


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not met within {timeout}s")


# How long a gpufleet process may take to exit after SIGTERM. Its loops end within a
# second of the signal (tests/integration/coordinator/app/test_coordinator_stops_busy.py);
# the rest is a loaded machine's slack. A backstop far above the measured worst case (about 1 s).
STOP_GRACE_S = 15.0


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    """Send `sig` and wait for the exit status. A process still running after
    `STOP_GRACE_S` is killed and fails the test: not stopping when told is a bug."""
    return stop_all([proc], sig)[0]


def stop_all(procs: Iterable[subprocess.Popen[bytes]], sig: int = signal.SIGTERM) -> list[int]:
    """`stop` for several processes at once: all are signalled first, so they stop in
    parallel; every one is reaped before a failure names those that overran."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    deadline = time.monotonic() + STOP_GRACE_S
    codes: list[int] = []
    overran: list[str] = []
    for proc in procs:
        try:
            codes.append(proc.wait(max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait(5))
            command = proc.args[0] if isinstance(proc.args, list | tuple) else proc.args
            overran.append(f"{Path(str(command)).name} (pid {proc.pid})")
    if overran:
        raise AssertionError(
            f"{', '.join(overran)} did not exit within {STOP_GRACE_S:.0f} s of"
            f" {signal.Signals(sig).name}; killed"
        )
    return codes


class Fleet:
    """A coordinator and agents as subprocesses, logs in a directory, all stopped by
    `close()`."""

    def __init__(self, workdir: Path, nats_url: str) -> None:
        self.workdir = workdir
        self.nats_url = nats_url
        self.operator_key = new_key()
        self.port = free_port()
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def operator(self) -> ApiClient:
        return ApiClient(self.url, self.operator_key, timeout_s=30)

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")
        self._logs.append(log)
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )

    def start_coordinator(self, *extra: str) -> None:
        self.coordinator = self._spawn(
            "coordinator",
            [
                str(BIN / "gpufleet-coordinator"),
                "--state-dir", str(self.workdir),
                "--nats-url", self.nats_url,
                "--port", str(self.port),
                "--insecure-bus",  # the test nats-server has no users
                *extra,
            ],
            # In the environment, never on a command line (`ps` shows those).
            env={"GPUFLEET_BOOTSTRAP_OPERATOR_KEY": self.operator_key},
        )  # fmt: skip
        wait_for(self.operator().healthy, what="coordinator healthy")

    def start_agent(
        self, node_id: str, pool_id: str, profile: str, interval_s: float, *extra: str
    ) -> None:
        self.agents[node_id] = self._spawn(
            f"agent-{node_id}",
            [
                str(BIN / "gpufleet-agent"),
                "--pool-id", pool_id,
                "--node-id", node_id,
                "--nats-url", self.nats_url,
                "--simulate", profile,
                "--interval", str(interval_s),
                *extra,
            ],
        )  # fmt: skip

    def close(self) -> None:
        """Stop the agents, then the coordinator; fails when one does not stop in time."""
        try:
            stop_all(self.agents.values())
        finally:
            try:
                if self.coordinator is not None:
                    stop(self.coordinator)
            finally:
                for log in self._logs:
                    log.close()
