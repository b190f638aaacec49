"""The read commands' views: what `pools`, `nodes`, `node`, `reservations`,
`reservation`, `tenants`, `keys`, `usage` and `summary` ask the API and how their rows
look. Each returns a `View`; `ops.kit.output` prints it in the chosen format."""

from __future__ import annotations

from typing import Any

from ops.cli.answers import atoms_text
from ops.kit.output import Column, Section, View
from ops.kit.session import Session
from shared.counts import COUNT_COLUMNS
from shared.wire import ATOM_CLASSES

SHORT_HEADERS = {"allocatable": "ALLOC'BLE", "provisioning": "PROV", "maintenance": "MAINT"}


def pool_row(pool: dict[str, Any], resource: str) -> dict[str, Any]:
    return next((r for r in pool["capacity"] if r["resource"] == resource), {})


def pools(session: Session, tenant: str | None) -> View:
    data = session.capacity(tenant)
    rows = []
    for p in data["pools"]:
        gpu, node = pool_row(p, "gpu"), pool_row(p, "node")
        rows.append(
            {
                "name": p["name"], "poolId": p["poolId"], "owner": p["owner"],
                "gpuModel": p["gpuModel"], "nodes": node.get("total", 0),
                "gpus": gpu.get("total", 0), "allocatable": gpu.get("allocatable", 0),
                "available": gpu.get("available", 0), "unhealthy": gpu.get("unhealthy", 0),
                "maintenance": gpu.get("maintenance", 0), "archived": p["archived"],
            }
        )  # fmt: skip
    columns = [
        Column("name", "POOL"), Column("poolId", "ID", wide=True), Column("owner", "OWNER"),
        Column("gpuModel", "GPU MODEL"), Column("nodes", "NODES", right=True),
        Column("gpus", "GPUS", right=True), Column("allocatable", "ALLOC'BLE", right=True),
        Column("available", "AVAILABLE", right=True),
        Column("unhealthy", "UNHEALTHY", right=True, wide=True),
        Column("maintenance", "MAINT", right=True, wide=True),
        Column("archived", "ARCHIVED", wide=True),
    ]  # fmt: skip
    return View(data["pools"], [Section(columns, rows, empty="no pools")])


def summary(session: Session, tenant: str | None) -> View:
    data = session.capacity(tenant)
    ids = session.format == "wide"
    sections = []
    for p in data["pools"]:
        archived = " (archived)" if p["archived"] else ""
        pool_id = f" [{p['poolId']}]" if ids else ""
        title = (
            f"pool {p['name']}{pool_id} owner={p['owner']} "
            f"gpuModel={p['gpuModel'] or '-'}{archived}"
        )
        columns = [Column("resource", "RESOURCE")] + [
            Column(c, SHORT_HEADERS.get(c, c.upper()), right=True) for c in COUNT_COLUMNS
        ]
        shown = [r for r in p["capacity"] if r["total"] or r["resource"] in ("gpu", "node")]
        sections.append(Section(columns, shown, title=title))
    models = [{"model": m} | cols for m, cols in data["byGpuModel"].items()]
    # Pools without a model (`other`): their GPUs by the model their agents report.
    mixed: dict[str, dict[str, int]] = {}
    for p in data["pools"]:
        for model, cols in (p.get("gpuModels") or {}).items():
            into = mixed.setdefault(model, {})
            for c, n in cols.items():
                into[c] = into.get(c, 0) + n
    if any("gpuModels" in p for p in data["pools"]):
        models = [m for m in models if m["model"] != "other"]
        models += [{"model": f"other: {m}"} | cols for m, cols in sorted(mixed.items())]
    columns = [Column("model", "GPU MODEL")] + [
        Column(c, SHORT_HEADERS.get(c, c.upper()), right=True)
        for c in ("total", "allocatable", "allocated", "reserved", "available")
    ]
    sections.append(Section(columns, models, title="whole GPUs by model:", empty="no GPUs"))
    return View(data, sections)


def pool_names(session: Session, tenant: str | None) -> dict[str, str]:
    return {p["poolId"]: p["name"] for p in session.capacity(tenant)["pools"]}


def _gpus(counts: dict[str, int]) -> str:
    parts = [f"{counts.get('gpu', 0)}"]
    if counts.get("gpu.mig"):
        parts.append(f"{counts['gpu.mig']} mig")
    if counts.get("gpu.slot"):
        parts.append(f"{counts['gpu.slot']} slots")
    return " + ".join(parts)


def _why(n: dict[str, Any]) -> str:
    s = n["state"]
    maintenance = [s["maintenance"]["reason"]] if s["maintenance"]["value"] else []
    return "; ".join([*maintenance, *s["health"]["reasons"]])


def device_name(atom: dict[str, Any]) -> str:
    a, cls = atom["attrs"], atom["class"]
    if cls == "node":
        return "node"
    if a.get("missing") and "gpuIndex" not in a:
        return f"missing {cls}"
    if cls == "gpu":
        return f"GPU{a.get('gpuIndex')}"
    if cls == "gpu.mig":
        return f"GPU{a.get('gpuIndex')} {a.get('profile')}"
    if cls == "gpu.slot":
        return f"GPU{a.get('gpuIndex')} slot {a.get('replica')}/{a.get('replicas')}"
    if cls == "nic.vf":
        vf = f" VF{a['vfIndex']}" if a.get("sriov") else ""
        return f"{a.get('nic')}{vf}"
    if cls == "disk":
        return f"{a.get('name')} {a.get('sizeGiB', '?')}GiB"
    return str(atom["deviceId"])


def _what(atom: dict[str, Any]) -> str:
    a = atom["attrs"]
    if atom["class"] == "node":
        return f"{a.get('gpuCount', 0)} GPUs, {a.get('vcpu', 0)} vCPU, {a.get('memoryGiB', 0)} GiB"
    if atom["class"] == "nic.vf":
        speed = a.get("speedMbps")
        return f"{a.get('pciAddress') or '-'}" + (f" {speed // 1000}G" if speed else "")
    return str(a.get("model") or a.get("missing") or "")


# A node's own atom first, then its devices in the declared order.
_CLASS_ORDER = ("node", *(c for c in ATOM_CLASSES if c != "node"))


def atom_order(atom: dict[str, Any]) -> tuple[int, int, str, int, str]:
    a = atom["attrs"]
    index = a.get("gpuIndex")
    sub_index = a.get("replica", a.get("vfIndex", a.get("gpuInstanceId", 0)))
    cls = atom["class"]
    return (
        _CLASS_ORDER.index(cls) if cls in _CLASS_ORDER else 99,
        index if isinstance(index, int) else -1,
        str(a.get("nic") or a.get("name") or ""),
        sub_index if isinstance(sub_index, int) else 0,
        atom["atomId"],
    )


USE_COLUMNS = [
    Column("use", "USE"), Column("sm", "SM %", right=True),
    Column("memory", "MEMORY", right=True), Column("users", "USERS"),
]  # fmt: skip


def user_text(user: dict[str, Any]) -> str:
    """One process as `pid kind:who`: its owner's readable name where the agent read one
    (a pod's namespace/name, a job's user, a container's name), else its id (a
    container's as `docker ps` shortens it)."""
    kind, who = user["ownerKind"], user.get("ownerName") or user["owner"]
    if kind == "container" and not user.get("ownerName"):
        who = who[:12]
    return f"{user['pid']} {kind}:{who}"


def use_cells(use: dict[str, Any] | None) -> dict[str, Any]:
    """A GPU's use as nvidia-smi would show it: busy or idle, SM %, memory, and each
    process as `pid kind:who` (`-` where the agent reports none or it is not the
    viewer's to see)."""
    if not use:
        return {}
    memory = use.get("memoryUsedMib")
    users = [user_text(u) for u in use.get("users") or ()]
    hidden = use.get("processes", 0) - len(users)
    if hidden > 0:
        users.append(f"+{hidden} more")
    return {
        "use": "busy" if use.get("inUse") else "idle",
        "sm": use.get("smUtil"),
        "memory": None if memory is None else f"{memory} MiB",
        "users": ", ".join(users),
    }


def holder_text(atom: dict[str, Any]) -> str:
    held = atom.get("heldBy")
    if not held:
        return ""
    if held.get("other"):
        return "(another tenant)"
    return f"{held['reservationId']} ({held['tenantId']})"


def node(session: Session, node_id: str, tenant: str | None) -> View:
    body = {"nodeId": node_id} | ({"tenantId": tenant} if tenant else {})
    n = session.call("nodes.get", body)
    s = n["state"]
    pool = pool_names(session, tenant).get(n["poolId"], n["poolId"])
    lines = [
        f"node {n['nodeId']}  pool {pool}  host {n['hostname'] or '-'}  "
        f"profile {n['profileId'] or '-'}",
        f"status {n['status']}  reachable {'yes' if s['reachable']['value'] else 'no'}  "
        f"health {s['health']['value']}"
        + (f" ({'; '.join(s['health']['reasons'])})" if s["health"]["reasons"] else ""),
    ]
    if s["maintenance"]["value"]:
        lines.append(f"maintenance: {s['maintenance']['reason']} (by {s['maintenance']['by']})")
    r = n["resources"]
    lines.append(f"vcpu {r['vcpu']}  memory {r['memoryGiB']} GiB  hugepages {r['hugepages1Gi']}")
    rows = [
        {
            "class": a["class"], "device": device_name(a), "what": _what(a), "health": a["health"],
            "bucket": a.get("bucket"), "heldBy": holder_text(a),
            "until": (a.get("heldBy") or {}).get("until"),
            "reasons": "; ".join(a["healthReasons"]), "atomId": a["atomId"],
        }
        | use_cells(a.get("use"))
        for a in sorted(n["atoms"], key=atom_order)
    ]  # fmt: skip
    columns = [
        Column("class", "CLASS"), Column("device", "DEVICE"), Column("what", "WHAT"),
        Column("health", "HEALTH"), Column("bucket", "BUCKET"), Column("heldBy", "HELD BY"),
        Column("until", "UNTIL", time=True, wide=True), *USE_COLUMNS,
        Column("reasons", "REASONS"), Column("atomId", "ATOM", wide=True),
    ]  # fmt: skip
    return View(n, [Section(columns, rows, empty="no atoms")], lines)


RESERVATION_COLUMNS = [
    Column("reservationId", "RESERVATION"), Column("tenantId", "TENANT"),
    Column("pool", "POOL", wide=True), Column("projectId", "PROJECT", wide=True),
    Column("state", "STATE"), Column("start", "START", time=True), Column("end", "END", time=True),
    Column("what", "ATOMS"), Column("nodes", "NODES"),
    Column("idleSince", "IDLE SINCE", time=True), Column("risk", "AT RISK"),
    Column("spot", "SPOT", wide=True),
    Column("leaseExpiresAt", "LEASE UNTIL", time=True, wide=True),
    Column("poolId", "POOL ID", wide=True),
]  # fmt: skip


def reservation_row(r: dict[str, Any], names: dict[str, str] | None = None) -> dict[str, Any]:
    nodes_ = sorted({a["nodeId"] for a in r["atoms"]})
    risk = r.get("atRisk") or {}
    return r | {"what": atoms_text(r["atoms"]), "nodes": ",".join(nodes_),
                "risk": risk.get("reason"),
                "pool": (names or {}).get(r["poolId"], r["poolId"])}  # fmt: skip


def reservations(session: Session, body: dict[str, Any], limit: int) -> View:
    found: list[dict[str, Any]] = []
    for page in session.pages("reservations.list", body | {"limit": min(limit, 200)}):
        found += page["reservations"]
        if len(found) >= limit:
            break
    found = found[:limit]
    names = pool_names(session, body.get("tenantId")) if found else {}
    rows = [reservation_row(r, names) for r in found]
    return View(found, [Section(RESERVATION_COLUMNS, rows, empty="no reservations")])


def reservation(session: Session, reservation_id: str, tenant: str | None) -> View:
    body = {"reservationId": reservation_id} | ({"tenantId": tenant} if tenant else {})
    r = session.call("reservations.get", body)
    names = pool_names(session, tenant)
    lines = [
        f"{r['reservationId']}  tenant {r['tenantId']}  pool {names.get(r['poolId'], r['poolId'])}"
        + (f"  project {r['projectId']}" if r.get("projectId") else ""),
    ]
    atoms = [{k: a[k] for k in ("atomId", "nodeId", "class")} for a in r["atoms"]]
    head = Section(
        [c for c in RESERVATION_COLUMNS if c.key not in ("reservationId", "tenantId")],
        [reservation_row(r, names)],
    )
    columns = [Column("class", "CLASS"), Column("nodeId", "NODE"), Column("atomId", "ATOM")]
    return View(r, [head, Section(columns, atoms, empty="no atoms")], lines)


def tenants(session: Session) -> View:
    data = session.call("tenants.list", {})
    columns = [
        Column("tenantId", "TENANT"), Column("name", "NAME"), Column("pools", "POOLS", right=True),
        Column("keys", "KEYS", right=True), Column("createdAt", "CREATED", time=True),
    ]  # fmt: skip
    return View(data["tenants"], [Section(columns, data["tenants"], empty="no tenants")])


def projects(session: Session, tenant: str | None) -> View:
    data = session.call("projects.list", {"tenantId": tenant} if tenant else {})
    columns = [
        Column("name", "PROJECT"), Column("projectId", "ID"), Column("tenantId", "TENANT"),
        Column("createdAt", "CREATED", time=True),
    ]  # fmt: skip
    return View(data["projects"], [Section(columns, data["projects"], empty="no projects")])


def keys(session: Session, tenant: str | None, revoked: bool) -> View:
    body: dict[str, Any] = {"includeRevoked": revoked} | ({"tenantId": tenant} if tenant else {})
    data = session.call("apiKeys.list", body)
    columns = [
        Column("keyId", "KEY ID"), Column("tenantId", "TENANT"), Column("roles", "ROLES"),
        Column("label", "LABEL"), Column("createdAt", "CREATED", time=True),
        Column("revokedAt", "REVOKED", time=True),
    ]  # fmt: skip
    return View(data["keys"], [Section(columns, data["keys"], empty="no keys")])


def usage(session: Session, body: dict[str, Any]) -> View:
    data = session.call("usage.report", body)
    local = session.local
    from ops.kit.output import format_time

    lines = [
        f"usage {format_time(data['from'], local)} → {format_time(data['to'], local)}"
        f" (as of {format_time(data['asOf'], local)}), unit-hours"
    ]
    used = [
        Column("usedHours", "USED", right=True), Column("weightedHours", "WEIGHTED", right=True),
        Column("efficiency", "EFFICIENCY", right=True),
    ]  # fmt: skip
    names = pool_names(session, body.get("tenantId"))
    pool_cols = [Column("pool", "POOL"), Column("poolId", "POOL ID", wide=True)]
    columns = [
        Column("tenantId", "TENANT"), *pool_cols, Column("projectId", "PROJECT"),
        Column("resource", "RESOURCE"), Column("hours", "HOURS", right=True), *used,
        Column("reservations", "RESERVATIONS", right=True),
    ]  # fmt: skip
    totals = [
        {"resource": k, "hours": v}
        | _use_of(data.get("usedTotals", {}).get(k), data.get("weightedTotals", {}).get(k), v)
        for k, v in data["totals"].items()
    ]
    total_cols = [Column("resource", "RESOURCE"), Column("hours", "TOTAL HOURS", right=True), *used]
    sections = [
        Section(total_cols, totals, title="totals:", empty="nothing ran in this window"),
        Section(columns, _named(data["rows"], names), title="by tenant, pool and project:"),
    ]
    if data.get("unbooked"):
        free = [
            *pool_cols, Column("usedHours", "USED GPU-HOURS", right=True),
            Column("weightedHours", "WEIGHTED", right=True),
        ]  # fmt: skip
        unbooked = _named(data["unbooked"], names)
        sections.insert(1, Section(free, unbooked, title="used with no booking:"))
    if data.get("byReservation"):
        per = [
            Column("reservationId", "RESERVATION"), Column("tenantId", "TENANT"),
            *pool_cols, Column("projectId", "PROJECT"),
            Column("resource", "RESOURCE"), Column("hours", "HOURS", right=True), *used,
        ]  # fmt: skip
        # The last section is the CSV one: per reservation when asked for.
        per_rows = _named(data["byReservation"], names)
        sections.append(Section(per, per_rows, title="by reservation:"))
    return View(data, sections, lines)


def _named(rows: list[dict[str, Any]], names: dict[str, str]) -> list[dict[str, Any]]:
    """Rows with their pool's name beside its id."""
    return [r | {"pool": names.get(r.get("poolId") or "", r.get("poolId"))} for r in rows]


def _use_of(used: float | None, weighted: float | None, booked: float) -> dict[str, Any]:
    """A totals row's used, weighted and efficiency (GPU classes only)."""
    if used is None:
        return {}
    return {
        "usedHours": used,
        "weightedHours": weighted,
        "efficiency": round(used / booked, 4) if booked else None,
    }
