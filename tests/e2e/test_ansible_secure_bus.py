"""Secure by default, as the Ansible roles deploy it: both roles refuse a host without
NATS credentials, or with a NATS URL that leaves the host without TLS, unless told
(`gpufleet_agent_allow_insecure_nats`, `gpufleet_coordinator_insecure_bus`); a secure
setting is written as such. The roles' config steps run for real on this host
(connection local) into a scratch directory; nothing is installed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from shared.ids import new_pool_id
from tests.ansible_play import play_role

pytestmark = pytest.mark.e2e

POOL = new_pool_id()
AGENT_USER = f"agent:{POOL}:node-01"
PASSWORDS = {AGENT_USER: "agent-secret", "coordinator": "coordinator-secret"}
REMOTE = "nats://10.20.30.40:4222"


def run_config_steps(tmp: Path, role: str, variables: dict[str, Any]) -> tuple[int, str]:
    """The role's `<role>_config` steps (the bus check comes first) into tmp/etc."""
    me = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True, check=True).stdout
    scratch = {
        f"{role}_config_dir": str(tmp / "etc"),
        f"{role}_file_owner": me,
        f"{role}_group": group.strip(),
        f"{role}_manage_user": False,
        f"{role}_manage_service": False,
    }
    if role == "gpufleet_agent":
        scratch |= {"gpufleet_agent_pool_id": POOL, "gpufleet_agent_node_id": "node-01"}
    result = play_role(tmp, role, scratch | variables, "--tags", f"{role}_config")
    return result.returncode, result.stdout + result.stderr


REFUSED = [
    pytest.param("gpufleet_agent", {}, id="agent-no-credentials"),
    pytest.param(
        "gpufleet_agent",
        {"gpufleet_nats_passwords": PASSWORDS, "gpufleet_agent_nats_url": REMOTE},
        id="agent-clear-text-off-host",
    ),
    pytest.param(
        "gpufleet_agent",
        {
            "gpufleet_nats_passwords": PASSWORDS,
            "gpufleet_agent_nats_url": f"tls://10.20.30.41:4222,{REMOTE}",
        },
        id="agent-one-clear-text-seed",
    ),
    pytest.param("gpufleet_coordinator", {}, id="coordinator-no-credentials"),
    pytest.param(
        "gpufleet_coordinator",
        {"gpufleet_nats_passwords": PASSWORDS, "gpufleet_coordinator_nats_url": REMOTE},
        id="coordinator-clear-text-off-host",
    ),
]


@pytest.mark.parametrize("role, variables", REFUSED)
def test_an_open_or_clear_text_bus_is_refused_before_anything_is_written(
    tmp_path: Path, role: str, variables: dict[str, Any]
) -> None:
    rc, out = run_config_steps(tmp_path, role, variables)
    assert rc != 0, out
    assert "Refuse an open or clear-text bus" in out and "tls:// URL" in out, out[-3000:]
    assert not (tmp_path / "etc").exists()


def test_the_agent_with_its_credentials_over_tls_or_on_the_host_is_deployed(
    tmp_path: Path,
) -> None:
    for i, url in enumerate(["tls://nats.example.net:4222", "nats://127.0.0.1:4222"]):
        tmp = tmp_path / str(i)
        tmp.mkdir()
        rc, out = run_config_steps(
            tmp,
            "gpufleet_agent",
            {"gpufleet_nats_passwords": PASSWORDS, "gpufleet_agent_nats_url": url},
        )
        assert rc == 0, out[-3000:]
        assert "agent-secret" in (tmp / "etc" / "agent-nats.creds").read_text()
        assert url in (tmp / "etc" / "agent.toml").read_text()


def test_the_opt_outs_deploy_an_open_bus_and_say_so(tmp_path: Path) -> None:
    agent, coordinator = tmp_path / "agent", tmp_path / "coordinator"
    agent.mkdir()
    coordinator.mkdir()
    rc, out = run_config_steps(
        agent,
        "gpufleet_agent",
        {"gpufleet_agent_allow_insecure_nats": True, "gpufleet_agent_nats_url": REMOTE},
    )
    assert rc == 0, out[-3000:]
    assert not (agent / "etc" / "agent-nats.creds").exists()
    rc, out = run_config_steps(
        coordinator,
        "gpufleet_coordinator",
        {"gpufleet_coordinator_insecure_bus": True, "gpufleet_coordinator_nats_url": REMOTE},
    )
    assert rc == 0, out[-3000:]
    assert "insecure_bus = true" in (coordinator / "etc" / "coordinator.toml").read_text()


def test_the_coordinator_with_its_credentials_over_tls_is_deployed_secure(
    tmp_path: Path,
) -> None:
    rc, out = run_config_steps(
        tmp_path,
        "gpufleet_coordinator",
        {
            "gpufleet_nats_passwords": PASSWORDS,
            "gpufleet_coordinator_nats_url": "tls://nats.example.net:4222",
        },
    )
    assert rc == 0, out[-3000:]
    toml = (tmp_path / "etc" / "coordinator.toml").read_text()
    assert "insecure_bus" not in toml
    assert "coordinator-nats.creds" in toml
    assert "coordinator-secret" in (tmp_path / "etc" / "coordinator-nats.creds").read_text()
