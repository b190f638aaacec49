"""Starting and stopping real gpufleet processes for end-to-end tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
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


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(5)


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

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")
        self._logs.append(log)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def start_coordinator(self, *extra: str) -> None:
        self.coordinator = self._spawn(
            "coordinator",
            [
                str(BIN / "gpufleet-coordinator"),
                "--state-dir", str(self.workdir),
                "--nats-url", self.nats_url,
                "--port", str(self.port),
                "--bootstrap-operator-key", self.operator_key,
                "--insecure-bus",  # the test nats-server has no users
                *extra,
            ],
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
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.agents.values():
            stop(proc)
        if self.coordinator is not None:
            stop(self.coordinator)
        for log in self._logs:
            log.close()
