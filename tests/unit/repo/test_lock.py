"""Dependencies are locked (uv.lock, with hashes) and the lock is the one everything
installs from: scripts/bootstrap-venv (so CI), and the Ansible roles through the
requirement files exported from it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
UV = Path(sys.executable).with_name("uv")
ROLES = ("agent", "coordinator")


def uv(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(UV), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_lock_matches_pyproject() -> None:
    out = uv("lock", "--check", "--offline")
    assert out.returncode == 0, f"uv.lock is stale: run scripts/lock\n{out.stderr}"


def test_a_range_the_lock_does_not_satisfy_is_caught(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    pyproject = tmp_path / "pyproject.toml"
    text = pyproject.read_text()
    nats_py = re.search(r'"nats-py\[nkeys\][^"]*"', text)
    assert nats_py is not None
    pyproject.write_text(text.replace(nats_py.group(0), '"nats-py[nkeys]<2.7"'))
    out = uv("lock", "--check", "--offline", cwd=tmp_path)
    assert out.returncode != 0


@pytest.mark.parametrize("role", ROLES)
def test_each_role_installs_exactly_the_locked_set(role: str, tmp_path: Path) -> None:
    fresh = tmp_path / "requirements.txt"
    out = uv(
        "export", "-q", "--frozen", "--extra", role, "--no-emit-project", "--no-dev",
        "-o", str(fresh),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    shipped = ROOT / "ansible" / "roles" / f"gpufleet_{role}" / "files" / "requirements.txt"
    body = [line for line in fresh.read_text().splitlines() if not line.startswith("#")]
    have = [line for line in shipped.read_text().splitlines() if not line.startswith("#")]
    assert have == body, "run scripts/lock"
    assert "--hash=sha256:" in shipped.read_text()


def test_bootstrap_and_the_roles_install_from_the_lock() -> None:
    bootstrap = (ROOT / "scripts" / "bootstrap-venv").read_text()
    assert "uv sync -q --locked" in bootstrap and "--require-hashes" in bootstrap
    for role in ROLES:
        tasks = (ROOT / "ansible" / "roles" / f"gpufleet_{role}" / "tasks" / "main.yml").read_text()
        assert "--require-hashes" in tasks and "--no-deps" in tasks
