"""A daemon's command line is read without click when every argument is a plain flag,
and that reading is click's: for each command line below the plain parser gives click's
answer or leaves it to click. A daemon that starts normally never loads click, about
1 MB of the agent's steady memory (bench/agent_bench.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent.config import Settings
from coordinator.config import CoordinatorSettings
from procs.settings import SettingsModel
from procs.settings.commands import parse_with_click
from procs.settings.flags import plain_flags

POOL = "pool_01jbench0000000000000000000"
PLAIN = [
    [],
    ["--pool-id", POOL, "--node-id", "n1"],
    ["--pool-id=" + POOL, "--node-id=n1", "--interval=2.5"],
    ["--log-level", "debug"],
    ["--log-level=Warning"],
    ["--provisioning", "--no-provisioning", "--provisioning"],
    ["--no-offer-boot-disks"],
    ["--label", "a=1", "--label=b=2", "--label", "c=3,d=4"],
    ["--nats-url", "nats://a:4222", "--nats-url", "nats://b:4222"],
    ["--nats-url="],
    ["--config", "/etc/gpufleet/agent.toml", "--simulate", "h100-sxm-8"],
    ["--management-nic", "eno1", "--share", "0-3:mps:4"],
]
CLICKS = [
    ["-h"],
    ["--help"],
    ["--pool-id"],
    ["--nats-url", "-x"],
    ["--log-level", "loud"],
    ["--provisioning=yes"],
    ["--no-such-flag", "1"],
    ["--pool", POOL],
    ["extra"],
    ["--", "--pool-id", POOL],
    ["--node-id", "-"],
]


@pytest.mark.parametrize("args", PLAIN, ids=" ".join)
def test_plain_command_lines_read_as_click_reads_them(args: list[str]) -> None:
    assert plain_flags(Settings, args) == parse_with_click(Settings, args)


@pytest.mark.parametrize("args", CLICKS, ids=" ".join)
def test_anything_else_is_left_to_click(args: list[str]) -> None:
    assert plain_flags(Settings, args) is None


@pytest.mark.parametrize("model", [Settings, CoordinatorSettings])
def test_every_flag_of_a_daemon_reads_as_click_reads_it(model: type[SettingsModel]) -> None:
    from procs.settings.flags import flag_specs

    for spec in flag_specs(model):
        for name in spec.names:
            if spec.style == "switch":
                args = [name, "--no-" + spec.names[0].removeprefix("--")]
            else:
                value = spec.choices[-1].upper() if spec.choices else "v"
                args = [name, value, f"{name}={value}"]
            assert plain_flags(model, args) == parse_with_click(model, args), args


PROBE = """
import json, os, sys
from agent import main, publisher, poller, reader, usage, xid_watch
from agent.config import Settings
from procs.settings import load
s = load(Settings, ["--pool-id", "{pool}", "--node-id", "n1", "--log-level", "info"], {{}})
print(json.dumps([s.node_id, "click" in sys.modules]))
"""


def test_a_daemon_that_starts_normally_never_loads_click() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(pool=POOL)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["n1", False]


def test_help_is_still_clicks(capsys: pytest.CaptureFixture[str]) -> None:
    from procs.settings.startup import parse_flags

    with pytest.raises(SystemExit) as exit_:
        parse_flags(Settings, ["--help"])
    assert exit_.value.code == 0
    assert "--nats-url" in capsys.readouterr().out
