"""The Slurm bridge's files as the gpufleet_coordinator role writes them (Ansible's own
template module, run locally) are what `gpufleet-slurm-bridge --config` reads: every
role variable arrives, the tenant mappings included, and the key only in the env file."""

from __future__ import annotations

from pathlib import Path

from ops.slurm.bridge.settings import BridgeSettings
from procs.nats import parse_credentials
from procs.settings import from_sources
from tests.unit.ansible.test_alerts_role_config import env_file, render

FILES = ("slurm-bridge.toml", "slurm-bridge.env", "slurm-bridge-nats.creds")


def test_the_bridge_reads_every_role_variable_from_the_rendered_files(tmp_path: Path) -> None:
    etc = render(
        tmp_path,
        FILES,
        gpufleet_coordinator_slurm_bridge_enabled=True,
        gpufleet_coordinator_nats_url="nats://nats-1:4222,nats://nats-2:4222",
        gpufleet_coordinator_subject_prefix="gf",
        gpufleet_coordinator_slurm_bridge_key="gpf_op_secret",
        gpufleet_coordinator_slurm_bridge_accounts={"acme": "acme-a,acme-b", "t.2": "x"},
        gpufleet_coordinator_slurm_bridge_users={"globex": "alice"},
        gpufleet_coordinator_slurm_bridge_settings={"gpu_tres": "off", "metrics_port": 9817},
        gpufleet_coordinator_slurm_bridge_nats_password="s3cret",
    )
    toml = etc / "slurm-bridge.toml"
    assert "gpf_op_secret" not in toml.read_text()
    s = from_sources(BridgeSettings, {"config": str(toml)}, env_file(etc / "slurm-bridge.env"))
    assert s.coordinator_key == "gpf_op_secret"
    assert s.coordinator_url == "http://127.0.0.1:8080"
    assert s.nats.url == "nats://nats-1:4222,nats://nats-2:4222" and s.nats.subject_prefix == "gf"
    assert s.durable == "slurm-bridge" and s.gpu_tres == "off" and s.metrics_port == 9817
    assert s.policy().accounts == {"acme": ("acme-a", "acme-b"), "t.2": ("x",)}
    assert s.policy().users == {"globex": ("alice",)}
    assert s.nats.credentials == str(etc / "slurm-bridge-nats.creds")
    creds = parse_credentials((etc / "slurm-bridge-nats.creds").read_text())
    assert creds == ("forwarder:slurm-bridge", "s3cret")


def test_without_mappings_the_tables_are_empty(tmp_path: Path) -> None:
    etc = render(tmp_path, FILES[:2], gpufleet_coordinator_slurm_bridge_key="k")
    s = from_sources(
        BridgeSettings, {"config": str(etc / "slurm-bridge.toml")},
        env_file(etc / "slurm-bridge.env"),
    )  # fmt: skip
    assert s.accounts == {} and s.users == {} and s.nats.credentials is None
