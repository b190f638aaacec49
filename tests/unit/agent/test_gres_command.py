"""`gpufleet-agent gres-uuids` reads the inventory the daemon keeps in its state
directory (agent.inventory_file) rather than NVML at every Slurm task start: this
node's file only, one the agent confirmed lately, NVML when there is no file or
`--nvml` asks. The simulated NVML stands in for the GPUs; the shipped TaskProlog with
a real Slurm and a real daemon is tests/e2e/test_slurm_jobs.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent.config import Settings
from agent.errors import CONFIG, NOT_LIVE
from agent.gres_command import gres_gpus, main
from agent.inventory_file import (
    FILE_NAME,
    HeldInventory,
    InventoryFile,
    InventoryFileError,
    read_inventory,
)
from agent.inventory_report import read_settings
from agent.state import AgentState
from shared.clock import FakeClock
from shared.slurm_gres import uuids_for
from shared.wire import Inventory, NodeHealth
from tests.unit.agent.test_inventory import inventory_of

NODE = "a100-m"


def _state(inv: Inventory, status: str = "healthy") -> AgentState:
    return AgentState(inv, NodeHealth(status=status), (), 0.0)  # type: ignore[arg-type]


def _kept(state_dir: Path, inv: Inventory) -> InventoryFile:
    """The daemon's file for `inv`, written as a poll would, stamped now."""
    kept = InventoryFile(state_dir / FILE_NAME, FakeClock(int(time.time() * 1000)))
    kept.on_state(_state(inv))
    return kept


def _held(path: Path) -> HeldInventory:
    held = read_inventory(path)
    assert held is not None
    return held


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["gres-uuids", *argv], {}, default_config=Path("/nonexistent"))
    out, err = capsys.readouterr()
    return code, out.strip(), err


def test_the_daemon_writes_its_inventory_when_it_changes_and_stamps_it_each_poll(
    tmp_path: Path,
) -> None:
    inv = inventory_of("a100-mig-8", tmp_path / "inv", NODE)
    clock = FakeClock()
    kept = InventoryFile(tmp_path / FILE_NAME, clock)
    kept.on_state(_state(inv))
    held = _held(tmp_path / FILE_NAME)
    assert held.inventory == inv and held.checked_at == clock.now_ms()
    clock.advance(5000)
    kept.on_state(_state(inv))  # the same inventory: confirmed, not rewritten
    assert kept.writes == 1 and _held(tmp_path / FILE_NAME).checked_at == clock.now_ms()
    # NVML released or failing: the GPUs listed may not be the host's now; not confirmed.
    clock.advance(5000)
    kept.on_state(_state(inv, "unmonitored"))
    assert _held(tmp_path / FILE_NAME).checked_at == clock.now_ms() - 5000
    other = inventory_of("h100-sxm-8", tmp_path / "inv2", NODE)
    kept.on_state(_state(other))
    assert kept.writes == 2 and _held(tmp_path / FILE_NAME).inventory == other
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [FILE_NAME]  # no temp left
    # No state directory (an agent run by hand): nothing written anywhere.
    away = InventoryFile(tmp_path / "none" / FILE_NAME, clock)
    away.on_state(_state(inv))
    assert not (tmp_path / "none").exists() and away.failures == 0


def test_gres_uuids_names_the_devices_from_the_daemons_file_not_nvml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a100 = read_settings(Settings(pool_id="pool_x", node_id=NODE, simulate="a100-mig-8"))
    flags = ["--node-id", NODE, "--simulate", "a100-mig-8", "--state-dir", str(tmp_path)]
    # No file yet (agent not started): NVML, here the simulated A100 host.
    assert _run(capsys, "6,7", *flags)[:2] == (0, ",".join(uuids_for(gres_gpus(a100), "6,7")))
    # The daemon's file is what gres-uuids reads: an H100 layout the NVML here lacks.
    h100 = inventory_of("h100-sxm-8", tmp_path / "inv", NODE)
    _kept(tmp_path, h100)
    code, out, _ = _run(capsys, "6,7", *flags)
    assert (code, out) == (0, ",".join(g.uuid for g in h100.gpus if g.index in (6, 7)))
    # --nvml reads NVML although the file is there.
    assert _run(capsys, "6,7", "--nvml", *flags)[1] == ",".join(uuids_for(gres_gpus(a100), "6,7"))
    code, out, err = _run(capsys, "8", *flags)
    assert (code, out) == (NOT_LIVE, "") and "8" in err


def test_a_file_of_another_node_or_one_not_confirmed_lately_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _kept(tmp_path, inventory_of("a100-mig-8", tmp_path / "inv", NODE))
    flags = ["--simulate", "a100-mig-8", "--state-dir", str(tmp_path)]
    code, out, err = _run(capsys, "0", "--node-id", "other", *flags)
    assert (code, out) == (CONFIG, "")
    assert f"holds the GPUs of node {NODE}, and this host is node other" in err
    old = time.time() - 3600  # the agent stopped an hour ago
    os.utime(tmp_path / FILE_NAME, (old, old))
    code, out, err = _run(capsys, "0", "--node-id", NODE, *flags)
    assert (code, out) == (NOT_LIVE, "")
    assert "last confirmed by the agent 1 h 0 min ago" in err and "--nvml" in err
    assert _run(capsys, "0", "--node-id", NODE, "--max-age", "7200", *flags)[0] == 0
    assert _run(capsys, "0", "--node-id", NODE, "--nvml", *flags)[0] == 0


def test_a_file_that_is_not_an_inventory_is_an_error_not_a_guess(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / FILE_NAME).write_text('{"nodeId": "a100-m"')
    with pytest.raises(InventoryFileError, match="does not hold an inventory"):
        read_inventory(tmp_path / FILE_NAME)
    code, out, err = _run(capsys, "0", "--node-id", NODE, "--state-dir", str(tmp_path))
    assert (code, out) == (CONFIG, "") and "does not hold an inventory" in err
