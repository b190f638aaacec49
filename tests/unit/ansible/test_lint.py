"""ansible/ passes `ansible-lint` (production profile, see ansible/.ansible-lint) and
`ansible-playbook --syntax-check` on site.yml with the example inventory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_DIR = REPO / "ansible"
BIN = Path(sys.executable).parent


def ansible_env(tmp_path: Path) -> dict[str, str]:
    """This venv's tools first on PATH; Ansible's and ansible-lint's caches in tmp_path
    rather than the home directory."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-remote-tmp"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "NO_COLOR": "1",
    }


def tool(name: str) -> str:
    path = BIN / name
    if not path.is_file():
        pytest.fail(f"{name} is missing: install the dev extra (pip install -e '.[dev]')")
    return str(path)


def test_ansible_lint_passes(tmp_path: Path) -> None:
    result = subprocess.run(
        [tool("ansible-lint"), "--offline", "--nocolor"],
        cwd=ANSIBLE_DIR,
        env=ansible_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Profile 'production' was required, and it passed" in result.stdout + result.stderr


def test_site_playbook_syntax_check_passes(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            tool("ansible-playbook"),
            "--syntax-check",
            "-i",
            "inventory/example.yml",
            "site.yml",
        ],
        cwd=ANSIBLE_DIR,
        env=ansible_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "playbook: site.yml" in result.stdout
