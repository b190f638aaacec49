"""The agent process imports none of pydantic, aiohttp or SQLAlchemy (SPEC §8), and not
nats-py either (issue 30 point 7: its own client, `procs.natsproto`, saves about 5 MB),
with no import-system tricks: its entry modules are imported in a fresh interpreter of
a venv that holds only what `pip install gpufleet[agent]` puts on a GPU host, and of
the development venv, where aiohttp is importable (nats-py imports it whenever it can:
about 11 MB, bench/README.md). The role's locked requirements must not bring aiohttp."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_host import ROOT, agent_distributions, host_venv

# Everything the long-running agent loads, the modules `agent.main` imports late included.
ENTRY = (
    "agent.main",
    "agent.publisher",
    "agent.poller",
    "agent.reader",
    "agent.xid_watch",
    "agent.sim.nvml",
    "agent.inventory_report",
    "agent.gres_command",
)
# Packages, or one module (importlib.metadata: email, zipfile and csv with it, ~3 MB).
HEAVY = ("pydantic", "aiohttp", "sqlalchemy", "nats", "importlib.metadata")
PROBE = """
import importlib, json, sys
for name in {entry!r}:
    importlib.import_module(name)
heavy = {heavy!r}
found = {{h for m in sys.modules for h in heavy if (m + ".").startswith(h + ".")}}
print(json.dumps(sorted(found)))
"""


ROLE_REQUIREMENTS = ROOT / "ansible/roles/gpufleet_agent/files/requirements.txt"


def _probe(python: Path, entry: tuple[str, ...] = ENTRY) -> set[str]:
    """The heavy packages the `entry` modules (the agent's) load under `python`."""
    done = subprocess.run(
        [str(python), "-c", PROBE.format(entry=entry, heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(python).parent,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The heavy packages loaded by the agent's entry modules on a host."""
    return _probe(host_venv(tmp_path_factory.mktemp("host") / "venv"))


def test_a_gpu_host_install_has_no_aiohttp_or_sqlalchemy() -> None:
    names = set(agent_distributions())
    assert "nats-py" in names and "nvidia-ml-py" in names and "msgspec" in names
    assert not names & {"aiohttp", "sqlalchemy"}


def test_the_agent_imports_neither_aiohttp_nor_sqlalchemy(loaded: set[str]) -> None:
    assert not loaded & {"aiohttp", "sqlalchemy"}


def test_the_agent_imports_no_pydantic(loaded: set[str]) -> None:
    assert "pydantic" not in loaded


def test_the_agent_imports_no_nats_py(loaded: set[str]) -> None:
    """nats-py stays installed (the base install's other processes use it) but unloaded."""
    assert "nats" not in loaded


def test_the_agent_does_not_read_its_install_metadata(loaded: set[str]) -> None:
    """Its version is declared in code (`procs.version`); nothing it loads imports
    importlib.metadata (nats-py did, for its own version)."""
    assert "importlib.metadata" not in loaded


def test_the_roles_locked_requirements_bring_no_aiohttp_or_sqlalchemy() -> None:
    """What the gpufleet_agent role installs on a host (the lock's export)."""
    names = {
        line.split("==")[0].lower()
        for line in ROLE_REQUIREMENTS.read_text().splitlines()
        if "==" in line and not line.startswith((" ", "#"))
    }
    assert {"nats-py", "nvidia-ml-py", "msgspec"} <= names
    assert not names & {"aiohttp", "sqlalchemy"}


def test_where_aiohttp_is_importable_the_agent_still_loads_neither_it_nor_nats_py() -> None:
    """A venv shared with the coordinator (here the development one, which has aiohttp):
    the agent loads the same as on a host; importing nats-py there loads aiohttp, so the
    probe can see both."""
    python = Path(sys.executable)
    assert not _probe(python)
    assert {"nats", "aiohttp"} <= _probe(python, ("nats",))
