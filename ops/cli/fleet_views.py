"""Fleet-wide views built from every node's detail: `gpus` (each GPU and MIG instance
with its state, holder and use, like nvidia-smi's process table across the fleet) and
the used/free/busy GPU counts `nodes` shows. The API lists nodes a page at a time and
gives atoms, holders and use per node (`nodes.get`); the details are asked a few at a
time in parallel."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import click

from ops.cli.views import (
    USE_COLUMNS,
    atom_order,
    device_name,
    holder_text,
    pool_names,
    use_cells,
)  # fmt: skip
from ops.kit.output import Column, Section, View
from ops.kit.session import Session

# What a GPU is now, one word: its node's hold when out of service, else held or free.
GPU_STATES = ("free", "held", "provisioning", "unhealthy", "maintenance", "unreachable")
# What it runs, as filters beside the states: in use, not, in use with no booking.
USE_STATES = ("busy", "idle", "unbooked")
GPU_CLASSES = ("gpu", "gpu.mig")
_PARALLEL = 8


def labels_option(f: Any) -> Any:
    return click.option(
        "-l", "--label", "labels", multiple=True, metavar="KEY=VALUE",
        help="only nodes with this label (repeatable: all must match)",
    )(f)  # fmt: skip


def parse_labels(given: Iterable[str]) -> dict[str, str]:
    wanted: dict[str, str] = {}
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--label")
        wanted[key.strip()] = value.strip()
    return wanted


def list_nodes(session: Session, tenant: str | None, pool: str | None) -> list[dict[str, Any]]:
    """Every node the key sees (one pool's when given), by nodeId."""
    body: dict[str, Any] = {"limit": 1000}
    if tenant:
        body["tenantId"] = tenant
    if pool:
        body["poolId"] = pool
    found: list[dict[str, Any]] = []
    while True:
        page = session.call("nodes.list", body)
        found += page["nodes"]
        if not page.get("nextCursor"):
            return found
        body["cursor"] = page["nextCursor"]


def has_labels(node: dict[str, Any], wanted: dict[str, str]) -> bool:
    labels = node.get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def details(session: Session, tenant: str | None, node_ids: Iterable[str]) -> list[dict[str, Any]]:
    """`nodes.get` of each node, in the order given."""
    ids = list(node_ids)
    extra = {"tenantId": tenant} if tenant else {}
    session.client()  # one client (and its key check) before the threads share it
    with ThreadPoolExecutor(max_workers=_PARALLEL) as pool:
        return list(pool.map(lambda n: session.call("nodes.get", {"nodeId": n} | extra), ids))


def gpu_state(atom: dict[str, Any]) -> str:
    if atom["bucket"] != "allocatable":
        return str(atom["bucket"])
    return "held" if atom.get("heldBy") else "free"


def use_state(atom: dict[str, Any]) -> str | None:
    use = atom.get("use")
    if not use:
        return None
    if not use.get("inUse"):
        return "idle"
    return "busy" if atom.get("heldBy") else "unbooked"


def gpu_counts(detail: dict[str, Any]) -> dict[str, int]:
    """A node's whole GPUs: held now, free to book now, and in use."""
    gpus = [a for a in detail["atoms"] if a["class"] == "gpu"]
    return {
        "used": sum(1 for a in gpus if a.get("heldBy")),
        "free": sum(1 for a in gpus if gpu_state(a) == "free"),
        "busy": sum(1 for a in gpus if (a.get("use") or {}).get("inUse")),
    }


def _model(atom: dict[str, Any]) -> str:
    return str(atom["attrs"].get("model") or "")


def models_matching(given: str, known: Iterable[str]) -> list[str]:
    """The models a short name stands for: the one spelled so (any case), else every one
    containing it (`H100` → `NVIDIA H100 80GB HBM3`), as agents report them."""
    want = given.strip().lower()
    models = sorted(set(known))
    return [m for m in models if m.lower() == want] or [m for m in models if want in m.lower()]


def pool_models(session: Session, tenant: str | None, pool: str | None) -> list[str]:
    """The GPU models the pool's nodes report (their `gpu.model` label)."""
    return [
        str(n["labels"]["gpu.model"])
        for n in list_nodes(session, tenant, pool)
        if (n.get("labels") or {}).get("gpu.model")
    ]


def gpus(
    session: Session, tenant: str | None, pool: str | None, models: tuple[str, ...],
    states: tuple[str, ...], wanted: dict[str, str],
) -> View:  # fmt: skip
    nodes = [n for n in list_nodes(session, tenant, pool) if has_labels(n, wanted)]
    names = pool_names(session, tenant)
    lowered = [m.lower() for m in models]
    found: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for detail in details(session, tenant, (n["nodeId"] for n in nodes)):
        for atom in sorted(detail["atoms"], key=atom_order):
            if atom["class"] not in GPU_CLASSES or (atom["attrs"].get("missing")):
                continue
            if lowered and not any(m in _model(atom).lower() for m in lowered):
                continue
            state, use = gpu_state(atom), use_state(atom)
            if states and state not in states and use not in states:
                continue
            found.append(atom | {"nodeId": detail["nodeId"], "poolId": detail["poolId"]})
            held = atom.get("heldBy") or {}
            rows.append(
                {
                    "node": detail["nodeId"], "device": device_name(atom),
                    "pool": names.get(detail["poolId"], detail["poolId"]),
                    "poolId": detail["poolId"], "model": _model(atom), "state": state,
                    "health": atom["health"], "heldBy": holder_text(atom),
                    "until": held.get("until"), "atomId": atom["atomId"],
                }
                | use_cells(atom.get("use"))
            )  # fmt: skip
    columns = [
        Column("node", "NODE"), Column("device", "GPU"), Column("pool", "POOL"),
        Column("model", "MODEL"), Column("state", "STATE"), Column("health", "HEALTH"),
        Column("heldBy", "HELD BY"), Column("until", "UNTIL", time=True, wide=True),
        *USE_COLUMNS, Column("poolId", "POOL ID", wide=True), Column("atomId", "ATOM", wide=True),
    ]  # fmt: skip
    return View(found, [Section(columns, rows, empty="no GPUs")])
