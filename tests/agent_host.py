"""A Python environment as `pip install gpufleet[agent]` leaves a GPU host: a venv with
this checkout's packages (as an editable install has them) and the distributions that
the base and `agent` requirements in pyproject.toml pull in, nothing else — no aiohttp,
no SQLAlchemy, whatever the development venv holds. The distributions are linked from
the development venv, so building one takes no download and well under a second.

The agent's import test runs the agent's modules in it: what they import there is what
they import on a host, with no import-system tricks in the agent. bench/agent_bench.py
builds its venv with pip, as the role does, because memory also depends on the bytecode
pip compiles at install.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["ROOT", "agent_distributions", "host_venv"]


def _project_requirements(extra: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [*project["dependencies"], *project["optional-dependencies"][extra]]
    return [Requirement(n) for n in names]


def agent_distributions(also: Sequence[str] = ()) -> dict[str, metadata.Distribution]:
    """The installed distributions `gpufleet[agent]` needs, by normalized name, and those
    `also` names with what they need."""
    found: dict[str, metadata.Distribution] = {}
    todo = [*_project_requirements("agent"), *map(Requirement, also)]
    while todo:
        req = todo.pop()
        key = req.name.lower().replace("_", "-")
        if key in found:
            continue
        dist = metadata.distribution(req.name)
        found[key] = dist
        for text in dist.requires or []:
            dep = Requirement(text)
            wanted = ["", *sorted(req.extras)]
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(dep)
    return found


def host_venv(dest: Path, also: Sequence[str] = ()) -> Path:
    """A venv at `dest` holding only what a GPU host has, and `also` (e.g. aiohttp: a
    venv shared with the coordinator); returns its python."""
    subprocess.run(
        [sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(dest)],
        check=True,
        timeout=60,
    )
    python = dest / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    site = Path(purelib)
    for dist in agent_distributions(also).values():
        if dist.files is None:
            raise RuntimeError(f"{dist.metadata['Name']} lists no files")
        tops = {f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}
        for top in sorted(tops):
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    # This checkout, the way an editable install adds it.
    (site / "gpufleet-checkout.pth").write_text(f"{ROOT}\n")
    return python
