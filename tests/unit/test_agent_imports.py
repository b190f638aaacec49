"""The agent process imports none of pydantic, aiohttp or SQLAlchemy (SPEC §8), with no
import-system tricks: its entry modules are imported in a fresh interpreter of a venv
that holds only what `pip install gpufleet[agent]` puts on a GPU host."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.agent_host import agent_distributions, host_venv

# Everything the long-running agent loads, the modules `agent.main` imports late included.
ENTRY = (
    "agent.main",
    "agent.publisher",
    "agent.poller",
    "agent.reader",
    "agent.xid_watch",
    "agent.sim.nvml",
    "agent.inventory_report",
)
HEAVY = ("pydantic", "aiohttp", "sqlalchemy")
PROBE = """
import importlib, json, sys
for name in {entry!r}:
    importlib.import_module(name)
heavy = {heavy!r}
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules if m.split(".")[0] in heavy}})))
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The heavy packages loaded by the agent's entry modules on a host."""
    python = host_venv(tmp_path_factory.mktemp("host") / "venv")
    done = subprocess.run(
        [str(python), "-c", PROBE.format(entry=ENTRY, heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(python).parent,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def test_a_gpu_host_install_has_no_aiohttp_or_sqlalchemy() -> None:
    names = set(agent_distributions())
    assert "nats-py" in names and "nvidia-ml-py" in names and "msgspec" in names
    assert not names & {"aiohttp", "sqlalchemy"}


def test_the_agent_imports_neither_aiohttp_nor_sqlalchemy(loaded: set[str]) -> None:
    assert not loaded & {"aiohttp", "sqlalchemy"}


def test_the_agent_imports_no_pydantic(loaded: set[str]) -> None:
    assert "pydantic" not in loaded
