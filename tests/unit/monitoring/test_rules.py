"""The shipped Prometheus alert rules: valid for promtool and behaving as their unit
tests (monitoring/prometheus/gpufleet-rules.test.yml) say."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.promql_names import metric_names

RULES = Path(__file__).parents[3] / "monitoring" / "prometheus"


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("GPUFLEET_TEST_TOOLS") == "required":
            pytest.fail("promtool not installed (Debian: apt-get install prometheus)")
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    return tool


def test_promtool_accepts_the_rules() -> None:
    out = subprocess.run(
        [_promtool(), "check", "rules", "gpufleet-rules.yml"],
        cwd=RULES, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 13 rules found" in out.stdout


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    out = subprocess.run(
        [_promtool(), "test", "rules", "gpufleet-rules.test.yml"],
        cwd=RULES, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (pool) (gpufleet_pool_gpus{state=~"a|b"})', {"gpufleet_pool_gpus"}),
        (
            "DCGM_FI_DEV_GPU_UTIL * on (UUID, Hostname) group_left (tenant) gpufleet_gpu_info",
            {"DCGM_FI_DEV_GPU_UTIL", "gpufleet_gpu_info"},
        ),
        ("histogram_quantile(0.99, sum by (le) (rate(x_bucket[$__rate_interval])))", {"x_bucket"}),
        ("sum(gpufleet_leader) < 1 or absent(gpufleet_leader) > 1e3", {"gpufleet_leader"}),
        ("label_values(gpufleet_pool_info, pool)", {"gpufleet_pool_info"}),
    ],
)
def test_metric_names_are_read_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
