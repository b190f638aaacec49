"""Every flag the docs' generated settings tables list is one the installed command
takes (issue 34: docs/operator.md listed a `--nats-url` that `gpufleet` has not; it is
`gpufleet alerts watch --nats-url`). Each table is read from the docs, and each flag
looked for in the real command's `--help`, run as an operator runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# (doc, table marker, the command its model's flags belong to)
TABLES = [
    ("docs/operator.md", "settings", ["gpufleet-coordinator"]),
    ("docs/operator.md", "cli-settings", ["gpufleet"]),
    ("docs/operator.md", "alerts-settings", ["gpufleet-alerts", "forward"]),
    ("docs/operator.md", "slurm-bridge-settings", ["gpufleet-slurm-bridge"]),
    ("docs/agent.md", "settings", ["gpufleet-agent"]),
]


def _table(doc: str, marker: str) -> list[str]:
    text = (ROOT / doc).read_text()
    begin = re.search(
        rf"<!-- {re.escape(marker)}:begin[^>]*-->\n(.*?)<!-- {marker}:end", text, re.S
    )
    assert begin is not None, f"{doc} has no {marker} table"
    flags = []
    for line in begin.group(1).splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[1] != "—":
            flags += re.findall(r"`([^`]*--[^`]*)`", cells[1])
    assert flags, f"{doc} {marker}: no flags read"
    return flags


def _help(argv: list[str]) -> str:
    env = {**os.environ, "COLUMNS": "200"}
    ran = subprocess.run(
        [str(BIN / argv[0]), *argv[1:], "--help"],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ran.returncode == 0, (argv, ran.stderr)
    return ran.stdout


@pytest.mark.parametrize(("doc", "marker", "argv"), TABLES, ids=[f"{d}:{m}" for d, m, _ in TABLES])
def test_every_documented_flag_is_one_the_command_takes(
    doc: str, marker: str, argv: list[str]
) -> None:
    missing = []
    helps: dict[str, str] = {}
    for documented in _table(doc, marker):
        # `alerts watch --nats-url`: the flag of that subcommand; `--x VALUE (repeat)`.
        words = documented.split()
        at = next(i for i, w in enumerate(words) if w.startswith("--"))
        command = argv + words[:at]
        flag = words[at].split("=")[0]
        key = " ".join(command)
        if key not in helps:
            helps[key] = _help(command)
        if not re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", helps[key], re.M):
            missing.append(f"{key} {flag}")
    assert missing == [], f"{doc} ({marker}) lists flags the command lacks: {missing}"
