"""Slurm's gres index → device UUID (shared.slurm_gres), and that `gpufleet slurm conf`
writes gres.conf in that same order, so the TaskProlog's `gpufleet-agent gres-uuids`
names the devices Slurm gave a job."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.gpu_map_file import gres_gpus
from ops.slurm.conf import Options, nodes_from_api, render
from shared.slurm_gres import GresGpu, GresIndexError, GresMig, gres_devices, uuids_for
from tests.unit.agent.test_inventory import inventory_of
from tests.unit.ops.slurm.test_conf import api_node

A100 = "NVIDIA A100-SXM4-80GB"


def _host() -> list[GresGpu]:
    """GPU 0 in MIG mode (3g, then two 1g), GPU 1 whole, GPU 2 unreadable, GPU 3 whole."""
    migs = (GresMig("3g.40gb", 1, 0, "MIG-a"), GresMig("1g.10gb", 5, 0, "MIG-b"),
            GresMig("1g.10gb", 3, 0, "MIG-c"))  # fmt: skip
    return [
        GresGpu(3, A100, "GPU-3"),
        GresGpu(0, A100, "GPU-0", mig_enabled=True, migs=migs),
        GresGpu(1, A100, "GPU-1"),
        GresGpu(2, A100, "GPU-2", missing=True),
    ]


def test_indexes_by_type_then_gpu_and_instance_as_slurm_numbers_them() -> None:
    # Slurm 22.05: whole a100 first (GPUs 1, 3; the unreadable 2 is not Slurm's), then
    # a100_1g.10gb in GPU-instance order, then a100_3g.40gb.
    devices = gres_devices(_host())
    assert [d.uuid for d in devices] == ["GPU-1", "GPU-3", "MIG-c", "MIG-b", "MIG-a"]
    assert [d.gres_type for d in devices] == ["a100", "a100", "a100_1g.10gb",
                                              "a100_1g.10gb", "a100_3g.40gb"]  # fmt: skip
    assert uuids_for(_host(), "3,2") == ["MIG-b", "MIG-c"]
    assert uuids_for(_host(), "1") == ["GPU-3"]  # not GPU 1: index ≠ GPU index


@pytest.mark.parametrize("bad", ["5", "", "1,x", "-1", "MIG-a"])
def test_an_index_that_does_not_fit_is_an_error(bad: str) -> None:
    with pytest.raises(GresIndexError):
        uuids_for(_host(), bad)


def test_gres_conf_lines_are_in_the_order_the_indexes_map(tmp_path: Path) -> None:
    """Line k of the node's gres.conf (as `slurm conf` writes it) is the device that
    `gres-uuids k` names: the same GPU file, the same MIG instance's caps files."""
    inv = inventory_of("a100-mig-8", tmp_path, "a100-m")
    conf = render("p", nodes_from_api([api_node(inv)]), Options(dev_dir="/d"))
    lines = [x for x in conf.gres.splitlines() if x.startswith("NodeName=a100-m ")]
    gpus = gres_gpus(inv)
    uuids = uuids_for(gpus, ",".join(str(k) for k in range(len(lines))))
    where = {g.uuid: (g.index, None) for g in inv.gpus} | {
        m.uuid: (g.index, m.gpu_instance_id) for g in inv.gpus for m in g.mig_instances
    }
    types = []
    for line, uuid in zip(lines, uuids, strict=True):
        gpu, gi = where[uuid]
        assert f"/d/nvidia{gpu}" in re.split("[ =,]", line)
        if gi is not None:  # nvidia-cap<3 + gpu*135 + gi*9>: the instance's access file
            assert f"/d/nvidia-caps/nvidia-cap{3 + gpu * 135 + gi * 9}" in line
        types.append(re.search(r"Type=(\S+)", line).group(1))  # type: ignore[union-attr]
    # Slurm numbers by type, sorted as the node line's Gres= lists them.
    assert types == sorted(types) and len(set(uuids)) == len(lines) == 17
