"""The agent process leaves JetStream, importlib.metadata and pydantic's plugin lookup out
of its imports (agent.lean) and still works where they are used. Each check runs in a
fresh interpreter: the stand-ins change that process's imports."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata

from agent.lean import dist_version

PRELUDE = """
import sys
sys.modules["aiohttp"] = None  # as agent.main does for a plain nats:// agent
import agent.lean
agent.lean.leave_out_unused_imports()
import agent.main, agent.publisher, agent.poller, agent.simulated
"""


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_agent_imports_leave_them_out() -> None:
    out = run(
        """
        heavy = ["email", "zipfile", "csv", "nats.js.api", "nats.js.client"]
        print(sorted(m for m in heavy if m in sys.modules))
        kinds = [type(sys.modules[m]).__name__ for m in ("nats.js", "importlib.metadata")]
        print(*kinds)
        """
    )
    assert out.split("\n")[:2] == ["[]", "_StandIn _StandIn"]


def test_stand_ins_load_the_real_modules_on_first_use() -> None:
    out = run(
        """
        import nats, nats.aio.client
        print(nats.aio.client.__version__)  # nats-py's own, read through the stand-in
        print(nats.js.api.Header.STATUS.value)  # what the client reads on status headers
        print(type(sys.modules["nats.js"]).__name__, nats.js is sys.modules["nats.js"])
        from nats.js import JetStreamContext
        import importlib.metadata
        print(importlib.metadata.version("pydantic"), callable(importlib.metadata.entry_points))
        print(type(sys.modules["importlib.metadata"]).__name__)
        """
    )
    lines = out.split("\n")
    assert lines[0] == metadata.version("nats-py")
    assert lines[1] == "Status"
    assert lines[2] == "module True"
    assert lines[3] == f"{metadata.version('pydantic')} True"
    assert lines[4] == "module"


def test_dist_version_is_what_importlib_metadata_finds() -> None:
    for name in ("nats-py", "nats_py", "pydantic", "pydantic-core", "gpufleet"):
        assert dist_version(name) == metadata.version(name)
    assert dist_version("no-such-distribution-here") is None
