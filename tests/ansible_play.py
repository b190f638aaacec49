"""One of this checkout's Ansible roles played on this host (connection local) for the
roles' tests: variables from a file, Ansible's own files kept in the scratch directory,
plain output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def play_role(
    tmp: Path, role: str, variables: dict[str, Any], *args: str, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    """`ansible-playbook` of a play that applies `role` with `variables` (and `args`
    after them, e.g. more `-e @file` or `--tags`)."""
    (tmp / "vars.json").write_text(json.dumps(variables))
    (tmp / "play.yml").write_text(
        f"- name: {role} into a scratch prefix\n  hosts: localhost\n  connection: local\n"
        f"  gather_facts: false\n  roles:\n    - role: {role}\n"
    )
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_ROLES_PATH": str(REPO / "ansible" / "roles"),
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
        # connection: local runs modules from the "remote" temp dir, ~/.ansible/tmp by default.
        "ANSIBLE_REMOTE_TEMP": str(tmp / "ansible-remote-tmp"),
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "ANSIBLE_NOCOLOR": "1",
    }
    return subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i", "localhost,",
            "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", f"@{tmp / 'vars.json'}",
            *args,
            str(tmp / "play.yml"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )  # fmt: skip
