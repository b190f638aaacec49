"""The production layout of docs/operator.md on loopback, for its end-to-end test: a NATS
cluster configured by `gpufleet nats-auth`, coordinator replicas, agents and the alert
forwarder configured from the Ansible roles' templates, Debian's Alertmanager and
Prometheus, and two small HTTP servers (a webhook that always fails, a static
dcgm-exporter sample). Every process is a child with its log in the work directory, and
`close()` stops them all.

The roles' templates are rendered with jinja2 itself (ansible-core brings it) and the
two Ansible filters they use, `to_json` and `bool`, over the role's defaults: playing the
role would also build a virtualenv and manage systemd units, which this test has no use
for; the files it writes are the same text.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import jinja2
import yaml

from ops.kit.embedded_nats import find_nats_server, free_port
from tests.e2e.fleet_procs import BIN, stop_all, wait_for

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "ansible" / "roles"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
PROMETHEUS = "/usr/bin/prometheus"


# -- the roles' templates ---------------------------------------------------------------


def _ansible_bool(value: Any) -> bool:
    """Ansible's `bool` filter: strings like "yes"/"true"/"1" are true."""
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true", "y", "t")
    return bool(value)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True
    )
    env.filters["to_json"] = json.dumps
    env.filters["bool"] = _ansible_bool
    return env


def role_vars(role: str, overrides: Mapping[str, Any], hostname: str) -> dict[str, Any]:
    """The role's defaults with `overrides` on top, templated values resolved (defaults
    refer to other variables, as `gpufleet_agent_nats_password` does)."""
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    out: dict[str, Any] = {**defaults, **overrides, "inventory_hostname": hostname}
    env = _environment()
    for _ in range(5):
        changed = False
        for key, value in out.items():
            if isinstance(value, str) and "{{" in value:
                out[key] = env.from_string(value).render(out)
                changed = True
        if not changed:
            return out
    raise AssertionError(f"{role}: defaults refer to each other in a loop")


def render(role: str, template: str, variables: Mapping[str, Any]) -> str:
    text = (ROLES / role / "templates" / template).read_text()
    return _environment().from_string(text).render(variables)


def read_env_file(text: str) -> dict[str, str]:
    """A systemd EnvironmentFile as the roles write it (values JSON-quoted)."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = json.loads(value) if value.startswith('"') else value
    return out


# -- processes --------------------------------------------------------------------------


class Procs:
    """Named child processes, each logging to `<workdir>/<name>.log`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    def spawn(
        self, name: str, argv: list[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")
        self._logs.append(log)
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=self.workdir,
        )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                # A SIGSTOPped process would not act on SIGTERM.
                proc.send_signal(signal.SIGCONT)
        try:
            stop_all(reversed(self.procs.values()))
        finally:
            for log in self._logs:
                log.close()


def http_get(url: str, token: str | None = None, timeout: float = 5.0) -> bytes:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body: bytes = resp.read()
        return body


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def answers(url: str) -> bool:
    try:
        http_get(url, timeout=2)
        return True
    except (urllib.error.URLError, OSError):
        return False


# -- small HTTP servers in the test process ---------------------------------------------


class SmallServer:
    """A threaded HTTP server on a loopback port: `FailingWebhook` and `StaticText`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


def failing_webhook(posts: list[bytes]) -> SmallServer:
    """A webhook that answers every POST with 503, keeping the bodies it was sent."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posts.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return SmallServer(Handler)


def static_text(text: Callable[[], str]) -> SmallServer:
    """Serves `text()` on every GET (a dcgm-exporter's /metrics)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return SmallServer(Handler)


# -- NATS -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NatsServer:
    name: str
    port: int
    route_port: int

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


def nats_auth(out: Path, cluster: list[NatsServer], *extra: str) -> dict[str, str]:
    """`gpufleet nats-auth` for a cluster, as docs/operator.md runs it; the passwords."""
    argv = [str(BIN / "gpufleet"), "nats-auth", "--out", str(out), "--cluster", "gpufleet"]
    for s in cluster:
        argv += ["--server", f"{s.name}=127.0.0.1:{s.port},127.0.0.1:{s.route_port}"]
    argv += ["--store-dir", str(out.parent / "jetstream"), *extra]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr + done.stdout
    doc = json.loads((out / "passwords.json").read_text())
    passwords: dict[str, str] = doc["gpufleet_nats_passwords"]
    return passwords


def nats_servers(names: tuple[str, ...]) -> list[NatsServer]:
    return [NatsServer(name, free_port(), free_port()) for name in names]


def start_nats(procs: Procs, auth_dir: Path, server: NatsServer) -> subprocess.Popen[bytes]:
    conf = auth_dir / f"nats-server-{server.name}.conf"
    return procs.spawn(server.name, [find_nats_server(), "-c", str(conf)])


def connected_port(log: str) -> int | None:
    """The NATS port an agent or coordinator last said it connected to."""
    ports = re.findall(r"connected to (?:nats at )?127\.0\.0\.1:(\d+)", log, re.I)
    return int(ports[-1]) if ports else None


# -- Alertmanager and Prometheus --------------------------------------------------------


ALERTMANAGER_CONFIG = """\
route:
  receiver: blackhole
  group_by: [alertname]
  group_wait: 1s
receivers:
  - name: blackhole
"""


def alertmanager_argv(workdir: Path, port: int) -> list[str]:
    conf = workdir / "alertmanager.yml"
    conf.write_text(ALERTMANAGER_CONFIG)
    return [
        ALERTMANAGER,
        f"--config.file={conf}",
        f"--storage.path={workdir / 'alertmanager-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]


def prometheus_argv(
    workdir: Path,
    port: int,
    coordinators: list[str],
    token: str,
    dcgm: str,
    alertmanager: str,
) -> list[str]:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(REPO / "monitoring" / "prometheus" / "gpufleet-rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {
                "job_name": "gpufleet",
                "authorization": {"credentials": token},
                "static_configs": [{"targets": coordinators}],
            },
            {"job_name": "dcgm", "static_configs": [{"targets": [dcgm]}]},
        ],
    }
    conf = workdir / "prometheus.yml"
    conf.write_text(yaml.safe_dump(config))
    return [
        PROMETHEUS,
        f"--config.file={conf}",
        f"--storage.tsdb.path={workdir / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


def promql(port: int, query: str) -> list[dict[str, Any]]:
    """An instant query's result vector."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    doc = json.loads(http_get(url))
    assert doc["status"] == "success", doc
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


def dcgm_sample(gpus: list[tuple[str, str, str, int]]) -> str:
    """dcgm-exporter's text for (UUID, Hostname, model, index) GPUs: utilisation and
    temperature, with its own label set."""
    lines = [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    ]
    for uuid, host, model, index in gpus:
        labels = (
            f'gpu="{index}",UUID="{uuid}",device="nvidia{index}",'
            f'modelName="{model}",Hostname="{host}",DCGM_FI_DRIVER_VERSION="550.54.15"'
        )
        lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {40 + index}")
    lines += [
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
    ]
    for uuid, host, model, index in gpus:
        labels = (
            f'gpu="{index}",UUID="{uuid}",device="nvidia{index}",'
            f'modelName="{model}",Hostname="{host}",DCGM_FI_DRIVER_VERSION="550.54.15"'
        )
        lines.append(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} {50 + index}")
    return "\n".join(lines) + "\n"


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """`wait_for` that answers how long it took."""
    start = time.monotonic()
    wait_for(predicate, timeout=timeout, what=what)
    return time.monotonic() - start
