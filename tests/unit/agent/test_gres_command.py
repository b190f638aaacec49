"""`gpufleet-agent gres-uuids` reads the GPU map the daemon keeps in its runtime
directory (agent.gpu_map_file) rather than NVML at every Slurm task start: this node's
file only, one the agent confirmed lately, NVML when there is no file or `--nvml` asks.
The file is public, the bookings private, as the shipped unit lays them out, and a job's
user (the TaskProlog's) reads the map. The simulated NVML stands in for the GPUs; the
shipped TaskProlog with a real Slurm and a real daemon is tests/e2e/test_slurm_jobs.py."""

from __future__ import annotations

import functools
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.bookings import BookingsKeeper
from agent.config import Settings
from agent.errors import CONFIG, NOT_LIVE
from agent.gpu_map_file import (
    FILE_NAME,
    GpuMapFile,
    GpuMapFileError,
    HeldGpuMap,
    gpu_map,
    gres_gpus,
    read_gpu_map,
)
from agent.gres_command import main
from agent.inventory_report import read_settings
from agent.state import AgentState
from shared.clock import FakeClock
from shared.slurm_gres import uuids_for
from shared.wire import Inventory, NodeBookings, NodeHealth
from tests.unit.agent.test_inventory import inventory_of

NODE = "a100-m"
UNIT = Path(__file__).resolve().parents[3] / "systemd" / "gpufleet-agent.service"
NOBODY = 65534


def _state(inv: Inventory, status: str = "healthy") -> AgentState:
    return AgentState(inv, NodeHealth(status=status), (), 0.0)  # type: ignore[arg-type]


def _kept(runtime_dir: Path, inv: Inventory) -> GpuMapFile:
    """The daemon's file for `inv`, written as a poll would, stamped now."""
    kept = GpuMapFile(runtime_dir / FILE_NAME, FakeClock(int(time.time() * 1000)))
    kept.on_state(_state(inv))
    return kept


def _held(path: Path) -> HeldGpuMap:
    held = read_gpu_map(path)
    assert held is not None
    return held


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["gres-uuids", *argv], {}, default_config=Path("/nonexistent"))
    out, err = capsys.readouterr()
    return code, out.strip(), err


def test_the_daemon_writes_its_gpu_map_when_it_changes_and_stamps_it_each_poll(
    tmp_path: Path,
) -> None:
    inv = inventory_of("a100-mig-8", tmp_path / "inv", NODE)
    clock = FakeClock()
    kept = GpuMapFile(tmp_path / FILE_NAME, clock)
    kept.on_state(_state(inv))
    held = _held(tmp_path / FILE_NAME)
    assert held.gpu_map == gpu_map(inv) and held.checked_at == clock.now_ms()
    assert held.gpu_map.node_id == NODE and held.gpu_map.gpus == gres_gpus(inv)
    clock.advance(5000)
    kept.on_state(_state(inv))  # the same inventory: confirmed, not rewritten
    assert kept.writes == 1 and _held(tmp_path / FILE_NAME).checked_at == clock.now_ms()
    # NVML released or failing: the GPUs listed may not be the host's now; not confirmed.
    clock.advance(5000)
    kept.on_state(_state(inv, "unmonitored"))
    assert _held(tmp_path / FILE_NAME).checked_at == clock.now_ms() - 5000
    other = inventory_of("h100-sxm-8", tmp_path / "inv2", NODE)
    kept.on_state(_state(other))
    assert kept.writes == 2 and _held(tmp_path / FILE_NAME).gpu_map == gpu_map(other)
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [FILE_NAME]  # no temp left
    # No state directory (an agent run by hand): nothing written anywhere.
    away = GpuMapFile(tmp_path / "none" / FILE_NAME, clock)
    away.on_state(_state(inv))
    assert not (tmp_path / "none").exists() and away.failures == 0


def test_gres_uuids_names_the_devices_from_the_daemons_file_not_nvml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a100 = read_settings(Settings(pool_id="pool_x", node_id=NODE, simulate="a100-mig-8"))
    flags = ["--node-id", NODE, "--simulate", "a100-mig-8", "--runtime-dir", str(tmp_path)]
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
    flags = ["--simulate", "a100-mig-8", "--runtime-dir", str(tmp_path)]
    code, out, err = _run(capsys, "0", "--node-id", "other", *flags)
    assert (code, out) == (CONFIG, "")
    assert f"holds the GPUs of node {NODE}, and this host is node other" in err
    # No node id and no config this user may read (a job's user): the host's agent's map.
    assert _run(capsys, "0", *flags)[0] == 0
    old = time.time() - 3600  # the agent stopped an hour ago
    os.utime(tmp_path / FILE_NAME, (old, old))
    code, out, err = _run(capsys, "0", "--node-id", NODE, *flags)
    assert (code, out) == (NOT_LIVE, "")
    assert "last confirmed by the agent 1 h 0 min ago" in err and "--nvml" in err
    assert _run(capsys, "0", "--node-id", NODE, "--max-age", "7200", *flags)[0] == 0
    assert _run(capsys, "0", "--node-id", NODE, "--nvml", *flags)[0] == 0


def test_a_file_that_is_not_a_gpu_map_is_an_error_not_a_guess(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / FILE_NAME).write_text('{"node_id": "a100-m"')
    with pytest.raises(GpuMapFileError, match="does not hold a GPU map"):
        read_gpu_map(tmp_path / FILE_NAME)
    code, out, err = _run(capsys, "0", "--node-id", NODE, "--runtime-dir", str(tmp_path))
    assert (code, out) == (CONFIG, "") and "does not hold a GPU map" in err


def _unit(key: str) -> str:
    """A directive of the shipped agent unit."""
    (value,) = [line.split("=", 1)[1] for line in UNIT.read_text().splitlines()
                if line.startswith(key + "=")]  # fmt: skip
    return value


@pytest.fixture
def host() -> Iterator[Path]:
    """A host's directories as the shipped unit and the role make them (`run/` its
    RuntimeDirectory, `lib/` its StateDirectory, `etc/` the config directory, root's,
    0750, its agent.toml 0640), under a root any user may enter (pytest's is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="gpufleet-host-"))
    root.chmod(0o755)
    for name, mode in (
        ("run", int(_unit("RuntimeDirectoryMode"), 8)),
        ("lib", int(_unit("StateDirectoryMode"), 8)),
        ("etc", 0o750),
    ):
        (root / name).mkdir()
        (root / name).chmod(mode)  # as systemd sets it, whatever the umask
    (root / "etc" / "agent.toml").write_text(f'node_id = "{NODE}"\n')
    (root / "etc" / "agent.toml").chmod(0o640)
    try:
        yield root
    finally:
        shutil.rmtree(root)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_gpu_map_is_public_and_the_bookings_private_as_shipped(host: Path) -> None:
    settings = Settings(pool_id="pool_x", node_id=NODE)
    # The daemon's defaults are where the unit's directories are.
    assert settings.runtime_dir == Path("/run") / _unit("RuntimeDirectory")
    assert settings.state_dir == Path("/var/lib") / _unit("StateDirectory")
    _kept(host / "run", inventory_of("a100-mig-8", host / "inv", NODE))
    keeper = BookingsKeeper(NODE, host / "lib" / "bookings.json")
    keeper.on_message(NodeBookings(node_id=NODE, etag="e1", sent_at=1).to_json())
    # Every user may enter run/ and read the map; only the agent writes it.
    assert (_mode(host / "run"), _mode(host / "run" / FILE_NAME)) == (0o755, 0o644)
    # No other user may enter lib/ or read the bookings (the gpufleet group may).
    assert _mode(host / "lib") & 0o007 == 0 and _mode(host / "lib" / "bookings.json") == 0o640


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_a_job_s_user_reads_the_gpu_map_without_nvml_and_not_the_bookings(host: Path) -> None:
    """As the TaskProlog runs it: as the job's user (here `nobody`), with the host's
    agent.toml out of reach, no NVML on this machine: only the public map can answer."""
    inv = inventory_of("a100-mig-8", host / "inv", NODE)
    _kept(host / "run", inv)
    BookingsKeeper(NODE, host / "lib" / "bookings.json").on_message(
        NodeBookings(node_id=NODE, etag="e1", sent_at=1).to_json()
    )
    env = {"GPUFLEET_RUNTIME_DIR": str(host / "run")}
    conf = host / "etc" / "agent.toml"
    code, said = _as_nobody(lambda: main(["gres-uuids", "6,7"], env, default_config=conf))
    assert (code, said.strip()) == (0, ",".join(uuids_for(gres_gpus(inv), "6,7"))), said
    for private in (host / "lib" / "bookings.json", conf):
        assert _as_nobody(functools.partial(_read, private)) == (1, "PermissionError\n")


def _read(path: Path) -> int:
    path.read_bytes()
    return 0


def _as_nobody(call: Callable[[], int]) -> tuple[int, str]:
    """`call()` in a child process that is `nobody`: its exit status and what it wrote
    (an exception: status 1 and its name). Forked, not run: this interpreter may live
    where `nobody` may not go."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            sys.stdout = sys.stderr = os.fdopen(write_end, "w")
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = call()
        except BaseException as exc:
            print(type(exc).__name__)
        finally:
            sys.stdout.flush()
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as said:
        text = said.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), text
