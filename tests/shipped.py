"""The packages a release ships, as pyproject.toml's package finder names them: the tests
that build or install a copy of the checkout copy these, so a new package is never left
out of what they install."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACKAGES: tuple[str, ...] = tuple(
    name.rstrip("*")
    for name in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
)
