"""Fleet-wide views built from the fleet's GPU list (`gpus.list`, a page of up to 1,000
units a request: 8 requests for 1,000 eight-GPU nodes, where asking `nodes.get` of each
node cost 1,000): `gpus` (each GPU and MIG instance with its state, holder and use, like
nvidia-smi's process table across the fleet) and the used/free/busy GPU counts `nodes`
and `watch` show."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click

from ops.cli.views import (
    USE_COLUMNS,
    _gpus,
    _why,
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


def _pages(
    session: Session, method: str, field: str, tenant: str | None, pool: str | None,
    body: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    """Every page of a listing (1,000 a page) of the tenant's (one pool's when given)."""
    body = body | {"limit": 1000}
    body |= {"tenantId": tenant} if tenant else {}
    body |= {"poolId": pool} if pool else {}
    return [item for page in session.pages(method, body) for item in page[field]]


def list_nodes(session: Session, tenant: str | None, pool: str | None) -> list[dict[str, Any]]:
    """Every node the key sees (one pool's when given), by nodeId."""
    return _pages(session, "nodes.list", "nodes", tenant, pool, {})


def has_labels(node: dict[str, Any], wanted: dict[str, str]) -> bool:
    labels = node.get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def list_gpus(
    session: Session, tenant: str | None, pool: str | None, models: Iterable[str] = (),
    states: Iterable[str] = (), wanted: dict[str, str] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every GPU unit the key sees that the filters pick (`gpus.list`), by node and atom."""
    body: dict[str, Any] = {"model": list(models), "state": list(states)}
    body |= {"labels": wanted} if wanted else {}
    return _pages(session, "gpus.list", "gpus", tenant, pool, body)


def gpu_counts(units: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per node, its whole GPUs: held now, free to book now, and in use."""
    counts: dict[str, dict[str, int]] = {}
    for u in units:
        if u["class"] != "gpu":
            continue
        c = counts.setdefault(u["nodeId"], {"used": 0, "free": 0, "busy": 0})
        c["used"] += 1 if u.get("heldBy") else 0
        c["free"] += 1 if u["state"] == "free" else 0
        c["busy"] += 1 if (u.get("use") or {}).get("inUse") else 0
    return counts


def nodes(
    session: Session, tenant: str | None, pool: str | None, states: tuple[str, ...] = (),
    labels: dict[str, str] | None = None,
) -> View:  # fmt: skip
    found = [
        n for n in list_nodes(session, tenant, pool)
        if (not states or n["status"] in states) and has_labels(n, labels or {})
    ]  # fmt: skip
    # Counted from the fleet's GPU list: a few requests, not one per node.
    counts = gpu_counts(list_gpus(session, tenant, pool, wanted=labels))
    none = {"used": 0, "free": 0, "busy": 0}
    names = pool_names(session, tenant)
    rows = [
        {
            "nodeId": n["nodeId"], "pool": names.get(n["poolId"], n["poolId"]),
            "poolId": n["poolId"], "status": n["status"],
            "health": n["state"]["health"]["value"], "gpus": _gpus(n["atoms"]),
            "nics": n["atoms"].get("nic.vf", 0), "disks": n["atoms"].get("disk", 0),
            "lastSeen": n["lastSeen"], "hostname": n["hostname"],
            "profile": n["profileId"],
            "why": _why(n),
        }
        | counts.get(n["nodeId"], none)
        for n in found
    ]  # fmt: skip
    columns = [
        Column("nodeId", "NODE"), Column("pool", "POOL"), Column("status", "STATUS"),
        Column("health", "HEALTH"), Column("gpus", "GPUS", right=True),
        Column("used", "USED", right=True), Column("free", "FREE", right=True),
        Column("busy", "BUSY", right=True),
        Column("nics", "NICS", right=True, wide=True),
        Column("disks", "DISKS", right=True, wide=True),
        Column("lastSeen", "LAST SEEN", time=True), Column("hostname", "HOSTNAME", wide=True),
        Column("profile", "PROFILE", wide=True),
        Column("poolId", "POOL ID", wide=True), Column("why", "WHY"),
    ]  # fmt: skip
    return View(found, [Section(columns, rows, empty="no nodes")])


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
    units = list_gpus(session, tenant, pool, models, states, wanted)
    found = [
        u for u in units if u["class"] in GPU_CLASSES and not u["attrs"].get("missing")
    ]  # fmt: skip
    found.sort(key=lambda u: (u["nodeId"], atom_order(u)))
    rows: list[dict[str, Any]] = []
    for atom in found:
        held = atom.get("heldBy") or {}
        rows.append(
            {
                "node": atom["nodeId"], "device": device_name(atom),
                "pool": atom["poolName"] or atom["poolId"], "poolId": atom["poolId"],
                "model": atom["model"], "state": atom["state"],
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
