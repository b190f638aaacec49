"""The README's commands install quietly: `scripts/bootstrap-venv` (what `./scripts/demo`
and `./scripts/test` run first) on a fresh copy of the project says only that it is
installing, before the minute it takes, and that it is done — no pip notes, no build
backend warnings — and leaves a working `gpufleet`; run again, it says nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shipped import PACKAGES

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_bootstrap_installs_without_a_word(tmp_path: Path) -> None:
    copy = tmp_path / "gpufleet"
    (copy / "scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "uv.lock"):
        shutil.copy(ROOT / name, copy / name)
    for name in ("bootstrap-venv", "uv-requirements.txt"):
        shutil.copy(ROOT / "scripts" / name, copy / "scripts" / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    # The CLI extra: the same editable build as `demo` and `dev`, with the fewest downloads.
    env |= {"PYTHON": sys.base_prefix + "/bin/python3"}
    ran = subprocess.run(
        [str(copy / "scripts" / "bootstrap-venv"), "cli"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "", ran.stdout
    assert ran.stderr.splitlines() == [
        "installing gpufleet's locked dependencies (cli) into .venv (first run only)...",
        "installed; .venv is ready",
    ], ran.stderr
    again = subprocess.run(
        [str(copy / "scripts" / "bootstrap-venv"), "cli"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert again.returncode == 0 and again.stdout + again.stderr == "", again
    version = subprocess.run(
        [str(copy / ".venv" / "bin" / "gpufleet"), "--version"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert version.returncode == 0 and version.stdout.startswith("gpufleet, version"), version
