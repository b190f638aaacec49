"""One poll end to end without NATS: readings → health → inventory, with a fake clock."""

from __future__ import annotations

from pathlib import Path

from agent.health import HealthPolicy
from agent.inventory import Identity
from agent.poller import Poller
from agent.reader import NvmlReader
from agent.sim.faults import FaultFile, write_faults
from agent.sim.nvml import SimulatedNvml
from agent.sim.profile import load_profile
from agent.sim.sysfs_tree import build_tree
from agent.sysfs import read_host
from shared.clock import FakeClock
from shared.ids import new_pool_id


def poller(tmp_path: Path, clock: FakeClock, profile: str = "h100-sxm-8") -> Poller:
    prof = load_profile(profile)
    root = build_tree(tmp_path / "root", prof)
    nvml = SimulatedNvml(prof, "n1", FaultFile(tmp_path / "faults.json"))
    return Poller(
        reader=NvmlReader(nvml, cpu_count=prof.vcpu),
        read_host=lambda: read_host(root),
        ident=Identity(node_id="n1", pool_id=new_pool_id(), profile_id=prof.id),
        clock=clock,
        boot_id="boot",
        policy=HealthPolicy(recover_after_s=10),
    )


def test_gpu_lost_then_back_with_hysteresis(tmp_path: Path) -> None:
    clock = FakeClock()
    p = poller(tmp_path, clock)
    first = p.poll_once()
    assert first.health.status == "healthy"
    write_faults(tmp_path / "faults.json", [{"kind": "lost", "gpu": 6}])
    clock.advance(5000)
    lost = p.poll_once()
    (device,) = lost.devices
    assert device.device_id == first.inventory.gpus[6].uuid and device.status == "unhealthy"
    assert lost.inventory.inventory_hash == first.inventory.inventory_hash  # atoms stay
    write_faults(tmp_path / "faults.json", [])
    clock.advance(5000)
    assert p.poll_once().devices != ()  # clear for 0 s
    clock.advance(9000)
    assert p.poll_once().devices != ()  # clear for 9 s
    clock.advance(1000)
    assert p.poll_once().devices == ()  # clear for 10 s


def test_nvml_down_keeps_gpus_and_reports_unmonitored(tmp_path: Path) -> None:
    clock = FakeClock()
    p = poller(tmp_path, clock)
    first = p.poll_once()
    write_faults(tmp_path / "faults.json", [{"kind": "nvml_down"}])
    down = p.poll_once()
    assert down.health.status == "unmonitored"
    assert down.inventory.gpus == first.inventory.gpus
    write_faults(tmp_path / "faults.json", [])
    assert p.poll_once().health.status == "healthy"


def test_thermal_slowdown_degrades_only(tmp_path: Path) -> None:
    clock = FakeClock()
    p = poller(tmp_path, clock, "l40s-pcie-4")
    write_faults(tmp_path / "faults.json", [{"kind": "thermal", "gpu": 0}])
    state = p.poll_once()
    assert state.health.status == "degraded"
    assert [d.status for d in state.devices] == ["degraded"]


def test_gpu_with_every_link_down_from_the_start_is_unhealthy(tmp_path: Path) -> None:
    clock = FakeClock()
    write_faults(tmp_path / "faults.json", [{"kind": "nvlink_down", "gpu": 3}])
    state = poller(tmp_path, clock).poll_once()
    (device,) = state.devices
    assert device.status == "unhealthy" and device.reasons[0].startswith("NVLink down: link 0,")
    assert state.inventory.gpus[3].uuid == device.device_id
