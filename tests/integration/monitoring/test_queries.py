"""Every metric the shipped dashboard and alert rules query is one the coordinator serves,
or the Slurm bridge serves (its own rules), or one of dcgm-exporter's default counters
(for the join panel)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ops.slurm.bridge.metrics import BridgeMetrics
from tests.integration.conftest import Api
from tests.integration.coordinator.runtime.test_metrics import scrape_text
from tests.promql_names import metric_names

MONITORING = Path(__file__).parents[3] / "monitoring"
# dcgm-exporter's default counters (etc/default-counters.csv) the dashboard may join with.
DCGM = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS"})
# Prometheus' own series for every target it scrapes (a replica that stops answering).
PROMETHEUS = frozenset({"up"})


def _exposed(text: str) -> set[str]:
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
        elif line and not line.startswith("#"):
            names.add(line.split("{")[0].split(" ")[0])
    return names


def _dashboard_exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and "query" in value:
                yield value["query"]
            else:
                yield from _dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dashboard_exprs(item)


def _rule_exprs() -> Iterator[str]:
    doc = yaml.safe_load((MONITORING / "prometheus" / "gpufleet-rules.yml").read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            yield rule["expr"]


async def test_dashboard_and_rules_query_only_served_metrics(api: Api) -> None:
    exposed = _exposed(await scrape_text(api)) | _exposed(BridgeMetrics().text().decode())
    dashboard = json.loads((MONITORING / "grafana" / "gpufleet.json").read_text())
    exprs = [*_dashboard_exprs(dashboard), *_rule_exprs()]
    assert len(exprs) > 20
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        used |= names
    unknown = used - exposed - DCGM - PROMETHEUS
    assert not unknown, f"queried but not served: {sorted(unknown)}"
    # The dashboard looks at the fleet, nodes, GPUs, bookings and the coordinator.
    assert {
        "gpufleet_pool_gpus",
        "gpufleet_gpu_info",
        "gpufleet_node_state",
        "gpufleet_booking_refusals_total",
        "gpufleet_heartbeat_age_seconds_bucket",
        # Use against bookings (issue 34).
        "gpufleet_gpu_user_info",
        "gpufleet_reservation_idle_since_seconds",
        # Reserved memory against use (issue 35).
        "gpufleet_memory_commitment_bytes",
        "gpufleet_memory_on_demand_bytes",
        "up",
    } <= used
