"""The gpufleet_agent Ansible role, run for real on this host (connection local) into a
scratch prefix with service management off: it builds a virtualenv with gpufleet[agent]
from this checkout, writes agent.toml and the NATS credentials from the role's
templates and `gpufleet nats-auth`'s passwords.json, and installs the unit. Then the
installed `gpufleet-agent` runs in simulate mode against a nats-server that enforces
the generated permissions, and its heartbeat and inventory arrive.

Run it alone: `.venv/bin/pytest tests/e2e/test_ansible_agent_role.py` (about 30-60 s,
most of it pip).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from ops.kit.embedded_nats import EmbeddedNats
from ops.kit.nats_bundle import build, write_bundle
from ops.kit.nats_users import AgentNode, agent_user, bcrypt_hasher
from shared.ids import new_pool_id
from shared.streams import stream_name
from shared.subjects import Subjects
from shared.wire import Heartbeat, Inventory
from tests.ansible_play import play_role
from tests.shipped import PACKAGES

# pip builds and installs the package: longer than the suite's default per-test limit.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
NODE = AgentNode(new_pool_id(), "ansible.node-01")
PREFIX = "tansible" + os.urandom(3).hex()


@dataclass
class Installed:
    root: Path
    log: str
    passwords: dict[str, str]
    server: EmbeddedNats

    @property
    def venv(self) -> Path:
        return self.root / "opt" / "venv"

    @property
    def etc(self) -> Path:
        return self.root / "etc" / "gpufleet"

    @property
    def unit(self) -> Path:
        return self.root / "systemd" / "gpufleet-agent.service"


def copy_checkout(dest: Path) -> Path:
    """What a release holds, copied so pip's in-tree build leaves the checkout alone."""
    dest.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in PACKAGES:
        shutil.copytree(REPO / name, dest / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    return dest


def run_role(tmp: Path, variables: dict[str, object], passwords_file: Path) -> str:
    # The generator's output is an Ansible vars file: gpufleet_nats_passwords.
    result = play_role(tmp, "gpufleet_agent", variables, "-e", f"@{passwords_file}", timeout=280)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("ansible-agent")
    auth = tmp / "auth"
    bundle = build(
        [NODE],
        alert_stream=stream_name(PREFIX),
        prefix=PREFIX,
        hash_password=bcrypt_hasher(4),
        store_dir=None,  # EmbeddedNats passes its own
    )
    write_bundle(auth, bundle)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True, check=True).stdout
    root = tmp / "root"
    (root / "systemd").mkdir(parents=True)  # as /etc/systemd/system is on any host
    with EmbeddedNats(config_file=str(auth / "nats-server.conf")) as server:
        log = run_role(
            tmp,
            {
                "gpufleet_agent_package_source": str(copy_checkout(tmp / "src")),
                "gpufleet_agent_python": sys.executable,
                "gpufleet_agent_prefix": str(root / "opt"),
                "gpufleet_agent_config_dir": str(root / "etc" / "gpufleet"),
                "gpufleet_agent_systemd_dir": str(root / "systemd"),
                "gpufleet_agent_user": user.strip(),
                "gpufleet_agent_group": group.strip(),
                "gpufleet_agent_file_owner": user.strip(),
                "gpufleet_agent_manage_user": False,
                "gpufleet_agent_manage_service": False,
                "gpufleet_agent_pool_id": NODE.pool_id,
                "gpufleet_agent_node_id": NODE.node_id,
                "gpufleet_agent_nats_url": server.url,
                "gpufleet_agent_subject_prefix": PREFIX,
                "gpufleet_agent_interval_s": 0.5,
                "gpufleet_agent_labels": {"rack": "r12", "zone": "lab"},
                "gpufleet_agent_sharing": [{"gpus": [0, 1], "mode": "timeslice", "replicas": 2}],
                "gpufleet_agent_nfd_features_dir": str(root / "nfd"),
            },
            auth / "passwords.json",
        )
        yield Installed(root, log, dict(bundle.passwords), server)


def test_the_role_builds_the_agent_venv_with_only_the_agent_extra(installed: Installed) -> None:
    assert "failed=0" in installed.log
    python = installed.venv / "bin" / "python"
    assert (installed.venv / "bin" / "gpufleet-agent").is_file()
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u, json; "
            "print(json.dumps({m: u.find_spec(m) is not None "
            "for m in ('pynvml', 'nats', 'agent', 'sqlalchemy', 'aiohttp')}))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = json.loads(probe.stdout)
    assert found == {
        "pynvml": True,
        "nats": True,
        "agent": True,
        "sqlalchemy": False,
        "aiohttp": False,
    }


def test_config_and_credentials_are_private_and_what_the_agent_reads(
    installed: Installed,
) -> None:
    for name in ("agent.toml", "agent.env", "agent-nats.creds"):
        mode = stat.S_IMODE((installed.etc / name).stat().st_mode)
        assert mode == 0o640, f"{name}: {oct(mode)}"
    config = tomllib.loads((installed.etc / "agent.toml").read_text())
    assert config["pool_id"] == NODE.pool_id
    assert config["nats_credentials"] == str(installed.etc / "agent-nats.creds")
    assert config["labels"] == {"rack": "r12", "zone": "lab"}
    creds = tomllib.loads((installed.etc / "agent-nats.creds").read_text())
    assert creds == {"user": agent_user(NODE), "password": installed.passwords[agent_user(NODE)]}
    assert config["nfd_features_dir"] == str(installed.root / "nfd")
    unit = installed.unit.read_text()
    assert f"ReadWritePaths=-{installed.root / 'nfd'}\n" in unit
    assert (
        f"ExecStart={installed.venv}/bin/gpufleet-agent --config {installed.etc}/agent.toml" in unit
    )


def test_the_installed_unit_verifies(installed: Installed) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    result = subprocess.run(
        [analyze, "verify", str(installed.unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stderr


async def test_the_installed_agent_reports_through_its_own_nats_user(
    installed: Installed, tmp_path: Path
) -> None:
    subjects = Subjects(PREFIX)
    heartbeats: list[Heartbeat] = []
    inventories: list[Inventory] = []

    async def on_hb(msg: Msg) -> None:
        heartbeats.append(Heartbeat.from_json(msg.data))

    async def on_inv(msg: Msg) -> None:
        inventories.append(Inventory.from_json(msg.data))

    nc = await nats.connect(
        installed.server.url,
        user="coordinator",
        password=installed.passwords["coordinator"],
        allow_reconnect=False,
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.setblocking(False)
    proc: asyncio.subprocess.Process | None = None
    try:
        await nc.subscribe(subjects.all_heartbeats, cb=on_hb)
        await nc.subscribe(subjects.all_inventories, cb=on_inv)
        await nc.flush()
        proc = await asyncio.create_subprocess_exec(
            str(installed.venv / "bin" / "gpufleet-agent"),
            "--config", str(installed.etc / "agent.toml"),
            "--simulate", "h100-sxm-8",
            env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        waiting = asyncio.ensure_future(loop.sock_recv(notify, 4096))
        exited = asyncio.ensure_future(proc.wait())
        await asyncio.wait({waiting, exited}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            waiting.cancel()
            exited.cancel()
            await asyncio.gather(waiting, exited, return_exceptions=True)
            raise AssertionError(f"the agent sent no READY=1 (exit status {proc.returncode})")
        exited.cancel()
        await asyncio.gather(exited, return_exceptions=True)
        ready = waiting.result()
        assert ready == b"READY=1"
        for _ in range(200):
            if heartbeats and inventories:
                break
            await asyncio.sleep(0.05)
        assert heartbeats and inventories
        assert heartbeats[0].node_id == NODE.node_id
        assert heartbeats[0].pool_id == NODE.pool_id
        inv = inventories[0]
        assert (inv.node_id, inv.labels["rack"], inv.labels["zone"]) == (NODE.node_id, "r12", "lab")
        # [[sharing]] from agent.toml: GPUs 0 and 1 as two time-slice slots each.
        assert sum(1 for a in inv.atoms if a.cls == "gpu.slot") == 4
        # The NFD feature file, where the role's variable says.
        features = (installed.root / "nfd" / "gpufleet").read_text()
        assert f"gpufleet.io/pool={NODE.pool_id}\n" in features
    except AssertionError as failed:
        err = b""
        if proc is not None:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 20)
        raise AssertionError(f"{failed}\nthe agent's stderr:\n{err.decode()}") from None
    finally:
        err = b""
        if proc is not None:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            if proc.stderr is not None and not proc.stderr.at_eof():
                _, err = await asyncio.wait_for(proc.communicate(), 20)
            else:
                await asyncio.wait_for(proc.wait(), 20)
        notify.close()
        await nc.close()
    assert proc.returncode == 0, err.decode()
