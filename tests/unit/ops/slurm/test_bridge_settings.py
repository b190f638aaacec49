"""The Slurm bridge's settings come from the daemons' mechanism: the `[slurm_bridge]`
table of its TOML file, then `GPUFLEET_*` env, then flags; the mapping tables become the
planner's policy; a bad value, or no operator key, exits 2 naming the setting; the
table in docs/operator.md is the model's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ops.slurm.bridge import settings as bridge_settings
from ops.slurm.bridge.daemon import SlurmBridge, gpu_tres_refused
from ops.slurm.bridge.model import SlurmNode, SlurmState
from ops.slurm.bridge.settings import BridgeSettings
from procs.settings import ConfigError, from_sources

DOCS = Path(__file__).resolve().parents[4] / "docs"
BIN = Path(sys.executable).parent


def test_operator_docs_bridge_table_is_the_model() -> None:
    text = (DOCS / "operator.md").read_text()
    assert bridge_settings.DOC_TABLE.apply(text) == text, (
        "run: python -m ops.slurm.bridge.settings docs/operator.md"
    )


def test_file_env_flags_and_the_policy_they_make(tmp_path: Path) -> None:
    cfg = tmp_path / "slurm-bridge.toml"
    cfg.write_text(
        '[slurm_bridge]\ncoordinator_url = "https://c:8080"\ngpu_tres = "count"\n'
        'drain_on = ["maintenance"]\n'
        '[slurm_bridge.accounts]\nacme = "acme-a, acme-b"\n'
        '[slurm_bridge.users]\nglobex = "alice"\n'
    )
    env = {"GPUFLEET_SLURM_BRIDGE_CONFIG": str(cfg), "GPUFLEET_SLURM_BRIDGE_KEY": "gpf_x"}
    s = from_sources(BridgeSettings, {}, env)
    assert s.coordinator_url == "https://c:8080" and s.coordinator_key == "gpf_x"
    policy = s.policy()
    assert policy.accounts == {"acme": ("acme-a", "acme-b")}
    assert policy.users == {"globex": ("alice",)}
    assert policy.gpu_tres == "count" and set(policy.drain_on) == {"maintenance"}
    flagged = from_sources(
        BridgeSettings, {"gpu_tres": "off"}, env | {"GPUFLEET_GPU_TRES": "typed"}
    )
    assert flagged.gpu_tres == "off"


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({}, "coordinator_key"),
        ({"coordinator_key": "k", "coordinator_url": "ftp://x"}, "coordinator_url"),
        ({"coordinator_key": "k", "drain_on": ["reboot"]}, "drain_on"),
        ({"coordinator_key": "k", "durable": "a.b"}, "durable"),
    ],
)
def test_bad_settings_name_the_field(values: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_sources(BridgeSettings, values, {})
    assert err.value.field.startswith(field)


def test_the_command_exits_2_naming_the_setting() -> None:
    done = subprocess.run(
        [str(BIN / "gpufleet-slurm-bridge"), "--gpu-tres", "typed"],
        capture_output=True, text=True, env={}, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "coordinator_key" in done.stderr


def test_gpufleet_slurm_bridge_is_the_same_command() -> None:
    done = subprocess.run(
        [str(BIN / "gpufleet"), "slurm", "bridge", "--durable", "a.b"],
        capture_output=True, text=True, env={}, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "durable" in done.stderr


def test_auto_is_the_default_and_plans_gpu_tres_until_slurm_refuses() -> None:
    env = {"GPUFLEET_SLURM_BRIDGE_KEY": "gpf_x"}
    s = from_sources(BridgeSettings, {"coordinator_url": "https://c:8080"}, env)
    assert s.gpu_tres == "auto" and s.policy().gpu_tres == "typed"
    bridge = SlurmBridge(s)
    mode = "gpufleet_slurm_bridge_gpu_tres_mode"
    assert f'{mode}{{mode="typed"}} 1.0' in bridge.metrics.text().decode()
    # Any other refusal changes nothing.
    whole = SlurmState({}, {"a": SlurmNode("a", gpu_types=("h100",))})
    assert not bridge._fall_back("Invalid node name specified", whole)  # noqa: SLF001
    assert bridge.policy.gpu_tres == "typed"
    # Slurm 22.05's answer, and "no such TRES" without AccountingStorageTRES: whole nodes.
    refusal = (
        "Error creating the reservation: TRES type 'gres/gpu:h100' not supported with reservations"
    )
    assert bridge._fall_back(refusal, whole)  # noqa: SLF001
    assert bridge.policy.gpu_tres == "off"
    text = bridge.metrics.text().decode()
    assert f'{mode}{{mode="off"}} 1.0' in text and f'{mode}{{mode="typed"}} 0.0' in text
    assert gpu_tres_refused("couldn't identify configured TRES 'gres/gpu:h100'")
    # Where slurm.conf gives each GPU a socket of its own: the booked GPUs' cores.
    again = SlurmBridge(s)
    per_gpu = SlurmState({}, {"a": SlurmNode("a", gpu_types=("h100",), cores_per_gpu=14)})
    assert again._fall_back(refusal, per_gpu)  # noqa: SLF001
    assert again.policy.gpu_tres == "cores"
    assert f'{mode}{{mode="cores"}} 1.0' in again.metrics.text().decode()


def test_an_explicit_mode_never_falls_back() -> None:
    env = {"GPUFLEET_SLURM_BRIDGE_KEY": "gpf_x"}
    s = from_sources(BridgeSettings, {"coordinator_url": "https://c", "gpu_tres": "typed"}, env)
    bridge = SlurmBridge(s)
    refusal = "TRES type 'gres/gpu' not supported with reservations"
    assert not bridge._fall_back(refusal, SlurmState({}, {}))  # noqa: SLF001
    assert bridge.policy.gpu_tres == "typed"
