"""The systemd units in systemd/: `systemd-analyze verify` clean (with ExecStart pointed
at this venv's real entry points), hardened, and the same as what the Ansible roles
install with their default variables."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
UNITS = {
    "gpufleet-agent.service": "gpufleet_agent",
    "gpufleet-coordinator.service": "gpufleet_coordinator",
    "gpufleet-alerts.service": "gpufleet_coordinator",
    "gpufleet-slurm-bridge.service": "gpufleet_coordinator",
}
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed on this machine"
)


def directives(text: str) -> list[tuple[str, str]]:
    """(key, value) lines of a unit, in order, without comments and blank lines."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            out.append((key, value))
    return out


def values(text: str, key: str) -> list[str]:
    return [v for k, v in directives(text) if k == key]


def runnable_copies(tmp_path: Path) -> list[Path]:
    """The shipped units with ExecStart pointed at this venv's entry points, so that
    verify's check that the binary exists is a real one."""
    out = []
    for name in UNITS:
        text = (REPO / "systemd" / name).read_text()
        # The agent has a venv of its own (docs/agent.md), the rest share one.
        agent = name == "gpufleet-agent.service"
        venv = "/opt/gpufleet-agent/venv/bin/" if agent else "/opt/gpufleet/venv/bin/"
        assert venv in text
        path = tmp_path / name
        path.write_text(text.replace(venv, f"{BIN}/"))
        exe = BIN / name.removesuffix(".service")
        assert exe.is_file(), exe
        out.append(path)
    return out


@needs_systemd_analyze
def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", *map(str, runnable_copies(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify exits 0 on unknown keys and bad values, and only says so: no output at all.
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""


@needs_systemd_analyze
def test_systemd_analyze_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a typo and a missing binary are reported."""
    assert SYSTEMD_ANALYZE
    unit = runnable_copies(tmp_path)[0]
    unit.write_text(
        unit.read_text()
        .replace("ProtectSystem=strict", "ProtectSystem=strictest")
        .replace(f"{BIN}/gpufleet-agent", "/nonexistent/gpufleet-agent")
    )
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert "strictest" in result.stderr
    assert "/nonexistent/gpufleet-agent" in result.stderr


@needs_systemd_analyze
@pytest.mark.parametrize("name", sorted(UNITS))
def test_exposure_is_low(tmp_path: Path, name: str) -> None:
    assert SYSTEMD_ANALYZE
    unit = next(p for p in runnable_copies(tmp_path) if p.name == name)
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    # 0 is fully locked down, 10 is not at all; "OK" ends at 3.9.
    assert float(match.group(1)) <= 2.0, result.stdout


@pytest.mark.parametrize("name", sorted(UNITS))
def test_both_units_notify_restart_and_are_hardened(name: str) -> None:
    text = (REPO / "systemd" / name).read_text()
    one = {k: v for k, v in directives(text)}
    assert one["Type"] == "notify"
    assert one["Restart"] == "on-failure"
    assert one["NoNewPrivileges"] == "yes"
    assert one["ProtectSystem"] == "strict"
    # The agent reads other processes' environment (GPU owners); nothing else.
    caps = {"gpufleet-agent.service": "CAP_SYS_PTRACE"}.get(name, "")
    assert one["CapabilityBoundingSet"] == caps and one["AmbientCapabilities"] == caps
    assert one["ProtectHome"] == "yes"
    assert one["PrivateTmp"] == "yes"
    assert "@system-service" in values(text, "SystemCallFilter")
    assert set(one["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert one["User"] == "gpufleet"
    assert "--config /etc/gpufleet/" in one["ExecStart"]
    assert one["EnvironmentFile"].startswith("-/etc/gpufleet/")


def test_the_coordinator_has_room_for_many_connections() -> None:
    """1,100 idle connections under the default 1024 descriptors locked out real calls."""
    one = dict(directives((REPO / "systemd" / "gpufleet-coordinator.service").read_text()))
    assert int(one["LimitNOFILE"]) >= 65536


def test_the_agent_reaches_nvidia_devices_through_device_allow_not_private_devices() -> None:
    text = (REPO / "systemd" / "gpufleet-agent.service").read_text()
    assert "PrivateDevices" not in dict(directives(text))
    assert values(text, "DevicePolicy") == ["closed"]
    allowed = {v.split()[0] for v in values(text, "DeviceAllow")}
    assert {"char-nvidiactl", "char-nvidia-uvm", "/dev/nvidiactl", "/dev/nvidia0"} <= allowed
    coordinator = (REPO / "systemd" / "gpufleet-coordinator.service").read_text()
    assert values(coordinator, "PrivateDevices") == ["yes"]
    assert values(coordinator, "StateDirectory") == ["gpufleet"]


@pytest.mark.parametrize("name", sorted(UNITS))
def test_the_ansible_template_with_role_defaults_is_the_shipped_unit(name: str) -> None:
    role = REPO / "ansible" / "roles" / UNITS[name]
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(role / "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,  # as Ansible's template module renders
        keep_trailing_newline=True,
    )
    rendered = env.get_template(f"{name}.j2").render(**defaults)
    assert directives(rendered) == directives((REPO / "systemd" / name).read_text())
