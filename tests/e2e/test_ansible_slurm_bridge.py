"""The coordinator role installs the Slurm bridge when asked: its steps
(`--tags gpufleet_slurm_bridge`) run for real on this host (connection local) into a
scratch directory: the settings, the key, the NATS credentials and the unit are written
for a bridge that reads them; enabled without an operator key, the role refuses."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from ops.slurm.bridge.settings import BridgeSettings
from procs.settings import from_sources
from tests.ansible_play import play_role
from tests.unit.ansible.test_alerts_role_config import env_file

pytestmark = pytest.mark.e2e
ROLE = "gpufleet_coordinator"


def _play(tmp: Path, variables: dict[str, Any]) -> tuple[int, str]:
    me = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True, check=True).stdout
    (tmp / "systemd").mkdir()
    scratch = {
        f"{ROLE}_config_dir": str(tmp / "etc"), f"{ROLE}_systemd_dir": str(tmp / "systemd"),
        f"{ROLE}_file_owner": me.strip(), f"{ROLE}_group": group.strip(),
        f"{ROLE}_manage_user": False, f"{ROLE}_manage_service": False,
        f"{ROLE}_slurm_bridge_enabled": True,
    }  # fmt: skip
    (tmp / "etc").mkdir()
    result = play_role(tmp, ROLE, scratch | variables, "--tags", "gpufleet_slurm_bridge")
    return result.returncode, result.stdout + result.stderr


def test_the_role_installs_a_bridge_that_reads_its_files(tmp_path: Path) -> None:
    rc, out = _play(
        tmp_path,
        {
            "gpufleet_coordinator_slurm_bridge_key": "gpf_operator_key",
            "gpufleet_coordinator_slurm_bridge_accounts": {"acme": "acme-research"},
            "gpufleet_coordinator_slurm_bridge_settings": {"gpu_tres": "off"},
            "gpufleet_nats_passwords": {"forwarder:slurm-bridge": "bridge-secret"},
        },
    )
    assert rc == 0, out[-3000:]
    assert "gpf_operator_key" not in out  # no_log
    etc = tmp_path / "etc"
    s = from_sources(
        BridgeSettings, {"config": str(etc / "slurm-bridge.toml")},
        env_file(etc / "slurm-bridge.env"),
    )  # fmt: skip
    assert s.coordinator_key == "gpf_operator_key" and s.gpu_tres == "off"
    assert s.policy().accounts == {"acme": ("acme-research",)}
    assert "bridge-secret" in (etc / "slurm-bridge-nats.creds").read_text()
    unit = (tmp_path / "systemd" / "gpufleet-slurm-bridge.service").read_text()
    assert f"--config {etc}/slurm-bridge.toml" in unit


def test_enabled_without_a_key_is_refused(tmp_path: Path) -> None:
    rc, out = _play(tmp_path, {})
    assert rc != 0 and "gpufleet_coordinator_slurm_bridge_key" in out
    assert not (tmp_path / "etc" / "slurm-bridge.toml").exists()
