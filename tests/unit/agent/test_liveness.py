"""What the coordinator's liveness needs from the agent: an interval it can judge, and a
bootId that lines up with the host's kernel boots."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.liveness import MAX_INTERVAL_S, agent_boot_id, check_interval, kernel_boot_id
from agent.main import main
from agent.sim.profile import load_profile
from agent.sim.sysfs_tree import build_tree
from procs.settings import ConfigError
from shared.ids import new_pool_id

POOL = new_pool_id()


def test_interval_above_the_coordinators_cap_is_refused() -> None:
    check_interval(MAX_INTERVAL_S)
    with pytest.raises(ConfigError) as err:
        check_interval(MAX_INTERVAL_S + 1)
    assert err.value.field == "interval_s" and "300" in str(err.value)


def test_agent_refuses_to_start_with_a_too_long_interval(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--pool-id", POOL, "--node-id", "n", "--simulate", "l40s-pcie-4", "--interval", "301"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "interval_s" in err and "unreachable" in err


def test_boot_id_carries_the_kernels_boot_id(tmp_path: Path) -> None:
    root = build_tree(tmp_path, load_profile("l40s-pcie-4"))
    kernel = kernel_boot_id(root)
    assert kernel is not None and len(kernel) == 36
    first, second = agent_boot_id(root), agent_boot_id(root)
    # Same kernel boot: the same prefix; each agent process its own sequence.
    assert first.startswith(kernel + "/") and second.startswith(kernel + "/")
    assert first != second and len(first) <= 64
    # A reboot: a new kernel boot id.
    assert kernel_boot_id(build_tree(tmp_path / "rebooted", load_profile("l40s-pcie-4"))) != kernel


def test_unreadable_kernel_boot_id_falls_back_to_the_process(tmp_path: Path) -> None:
    assert kernel_boot_id(tmp_path) is None
    boot = agent_boot_id(tmp_path)
    assert boot.startswith("unknown/") and boot != agent_boot_id(tmp_path)
