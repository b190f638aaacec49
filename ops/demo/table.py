"""Plain-text rendering of capacity for terminals (the CLI and the demo)."""

from __future__ import annotations

from typing import Any

from shared.counts import COUNT_COLUMNS
from shared.wire import ATOM_CLASSES

SHOWN = (*ATOM_CLASSES, "vcpu", "memoryGiB")
COLUMNS = COUNT_COLUMNS
_SHORT = {"allocatable": "alloc'ble", "provisioning": "prov", "maintenance": "maint"}


def render_summary(summary: dict[str, Any]) -> str:
    lines: list[str] = []
    header = f"  {'resource':<12}" + "".join(f"{_SHORT.get(c, c):>12}" for c in COLUMNS)
    for pool in summary["pools"]:
        archived = " (archived)" if pool["archived"] else ""
        lines.append(
            f"pool {pool['name']} [{pool['poolId']}] owner={pool['owner']} "
            f"gpuModel={pool['gpuModel'] or '-'}{archived}"
        )
        lines.append(header)
        for row in pool["capacity"]:
            if row["resource"] not in SHOWN or row["total"] == 0:
                continue
            lines.append(f"  {row['resource']:<12}" + "".join(f"{row[c]:>12}" for c in COLUMNS))
        lines.append("")
    lines.append("whole GPUs by model:")
    for model, cols in summary["byGpuModel"].items():
        lines.append(
            f"  {model:<28} total={cols['total']} allocatable={cols['allocatable']} "
            f"available={cols['available']}"
        )
    return "\n".join(lines)
