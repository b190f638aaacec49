"""The demo's promise against use (SPEC §10): a workload under its booking, one with no
booking, and a booking left idle, with what the ledger says about each."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ops.kit.client import ApiClient, ClientError

# The demo's coordinator says `reservation.idle` after this long (the default is 30 min).
IDLE_AFTER_S = 60
POD = "5f0c2a1e-7d3b-4c8e-9a61-0b2d4e6f8a10"


def add_faults(path: Path, entries: list[dict[str, Any]]) -> None:
    """Add entries to an agent's fault file, keeping what it holds (atomically)."""
    held = json.loads(path.read_text())["faults"] if path.exists() else []
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"faults": [*held, *entries]}))
    tmp.replace(path)


def _gpus(client: ApiClient, node_id: str) -> list[dict[str, Any]]:
    atoms = client.call("nodes.get", {"tenantId": "acme", "nodeId": node_id})["atoms"]
    return sorted((a for a in atoms if a["class"] == "gpu"), key=lambda a: a["attrs"]["gpuIndex"])


def show_use(
    acme: ApiClient, booking: dict[str, Any], pools: dict[str, str], fault_file: Any
) -> list[str]:
    """Run the three workloads through the agents' fault files and say what the ledger
    saw; `fault_file(node_id)` is an agent's fault file."""
    atom = booking["atoms"][0]
    node = atom["nodeId"]
    worked = next(g for g in _gpus(acme, node) if g["atomId"] == atom["atomId"])
    idle = acme.call("reservations.create", {
        "tenantId": "acme", "poolId": pools["mixed"], "devices": [{"class": "gpu", "count": 1}],
        "duration": "2h", "idempotencyKey": "demo-idle-notebook",
    })  # fmt: skip
    idle_node = idle["atoms"][0]["nodeId"]
    free = next(
        (
            g
            for g in _gpus(acme, idle_node)
            if g["heldBy"] is None and not g["attrs"].get("missing")
        ),
        None,
    )
    add_faults(fault_file(node), [{
        "kind": "process", "pid": 4242, "gpus": [worked["attrs"]["gpuIndex"]], "memory_mib": 30720,
        "host_memory_mib": 24576,  # what chargeback counts (its cgroup's memory)
        "env": {"GPUFLEET_RESERVATION_ID": booking["reservationId"]},
        "util": {"shape": "constant", "level": 85},
    }])  # fmt: skip
    if free is not None:
        add_faults(fault_file(idle_node), [{
            "kind": "process", "pid": 777, "gpu": free["attrs"]["gpuIndex"], "memory_mib": 2048,
            "host_memory_mib": 4096,
            "cgroup": f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice",
        }])  # fmt: skip
    lines = []
    deadline = time.monotonic() + 20
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline and len(seen) < (2 if free is not None else 1):
        for gpu_node, gpu in ((node, worked), (idle_node, free)):
            if gpu is None:
                continue
            now = next(g for g in _gpus(acme, gpu_node) if g["atomId"] == gpu["atomId"])
            # A tenant sees who runs a GPU only where it holds it; that one runs is enough.
            if now.get("use", {}).get("inUse"):
                seen[gpu["atomId"]] = now["use"]
        time.sleep(0.5)
    use = seen.get(worked["atomId"])
    if use is not None and use["users"]:
        lines.append(
            f"  a workload runs under {booking['reservationId']} on {node} GPU"
            f" {worked['attrs']['gpuIndex']}: the ledger sees {use['smUtil']}% SM, owner"
            f" {use['users'][0]['ownerKind']} {use['users'][0]['owner']}"
        )
    if free is not None and free["atomId"] in seen:
        lines.append(
            f"  a pod runs on {idle_node} GPU {free['attrs']['gpuIndex']} with no booking:"
            " the coordinator says gpu.unbookedUse (usage.report counts it as unbooked)"
        )
    lines.append(
        f"  {idle['reservationId']} holds {idle_node} with nothing running: reservation.idle"
        f" after {IDLE_AFTER_S} s (the demo's idle_after_s); gpufleet usage shows its efficiency"
    )
    lines += small_bill(acme, booking["start"])
    return lines


def small_bill(acme: ApiClient, since: int) -> list[str]:
    """acme's device bookings so far as chargeback sees them (usage.consumption): booked
    GPU-hours used and unused; use is written every minute, so early on it is small."""
    try:
        spent = acme.call(
            "usage.consumption",
            {"tenantId": "acme", "from": since, "to": int(time.time() * 1000) + 60_000},
        )
    except ClientError:
        return []
    rows = spent["reservations"]
    booked = sum(r["bookedHours"] for r in rows)
    used = sum(r["usedHours"] for r in rows)
    return [
        f"  acme's bill so far: {booked:.3f} GPU-hours booked, {used:.3f} used, "
        f"{booked - used:.3f} unused (idle included); FOCUS rows: gpufleet usage export"
    ]
