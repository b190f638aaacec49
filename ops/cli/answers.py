"""Short answers to writes, for people: `h100-b → maintenance (swap PSU); 1 reservation
at risk` rather than the node's 600 lines of JSON (still there with `-o json`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ops.kit.output import format_time
from ops.kit.server_text import shown_values
from ops.kit.session import Session


def count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def at_risk(answer: dict[str, Any]) -> int | None:
    """How many reservations a change put at risk, when the answer says."""
    for key in ("atRisk", "reservationsAtRisk", "atRiskReservations"):
        value = answer.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            return value
        if isinstance(value, list):
            return len(value)
    return None


def atoms_text(atoms: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for atom in atoms:
        counts[atom.get("class", "?")] = counts.get(atom.get("class", "?"), 0) + 1
    return ", ".join(f"{n} {cls}" for cls, n in counts.items()) or "nothing"


def _maintenance(body: dict[str, Any], a: dict[str, Any], local: bool) -> str:
    node = a.get("nodeId", body.get("nodeId"))
    if body.get("maintenance"):
        text = f"{node} → maintenance ({body.get('reason', '')})"
    else:
        text = f"{node} → out of maintenance (now {a.get('status', '?')})"
    if a.get("changed") is False:
        text += "; no change, it already was"
    risk = at_risk(a)
    if risk is not None:
        text += f"; {count(risk, 'reservation')} at risk"
    return text


def _reservation(verb: str) -> Callable[[dict[str, Any], dict[str, Any], bool], str]:
    def say(body: dict[str, Any], a: dict[str, Any], local: bool) -> str:
        nodes = sorted({x.get("nodeId", "?") for x in a.get("atoms", [])})
        text = f"{a.get('reservationId')} {verb}{a.get('state', '?')}"
        if verb == "":
            text += f": {atoms_text(a.get('atoms', []))} on {', '.join(nodes) or '-'}"
            text += f", {format_time(a.get('start'), local)} → {format_time(a.get('end'), local)}"
        if a.get("leaseExpiresAt") is not None:
            text += f"; lease until {format_time(a['leaseExpiresAt'], local)}"
        # A GPU in unbooked use it took (only when no idle one fitted): never hidden.
        for warning in a.get("warnings") or ():
            text += f"\nwarning: {warning}"
        return text

    return say


def _extended(body: dict[str, Any], a: dict[str, Any], local: bool) -> str:
    before, after = a["previousEnd"], a["end"]
    ends = f"end {format_time(before, local)} → {format_time(after, local)}"
    moved = after - before
    by = f"{'+' if moved > 0 else '-'}{_span(abs(moved))}"
    if a.get("dryRun"):
        verb = "would stay" if not moved else f"could move ({by})"
        return f"dry run: {a['reservationId']} {verb}: {ends}; nothing changed"
    if not moved:
        return f"{a['reservationId']}: no change, it already ends {format_time(after, local)}"
    what = "extended" if moved > 0 else "shortened"
    return f"{a['reservationId']} {what} {by}, {a.get('state', '?')}: {ends}"


def _span(ms: int) -> str:
    """A length as `2h30m`, `45s`, `1d2h`."""
    seconds, out = ms // 1000, ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out += f"{seconds // size}{unit}"
            seconds %= size
    return out or f"{ms}ms"


def _quota(body: dict[str, Any], a: dict[str, Any], local: bool) -> str:
    where = body.get("poolId") or "all its pools"
    return f"{a.get('tenantId')}: {body.get('resource')} ≤ {body.get('limit')} in {where}"


def _shape(body: dict[str, Any], a: dict[str, Any], local: bool) -> str:
    where = f"pool {a['poolId']}" if a.get("poolId") else f"{a['profileId']}@{a['profileVersion']}"
    counts = " ".join(f"{cls}={n}" for cls, n in a["counts"].items())
    return f"{where}: expected {counts}" if counts else f"{where}: no expected shape"


def _accepted(body: dict[str, Any], a: dict[str, Any], local: bool) -> str:
    if not a["changed"]:
        return f"{a['nodeId']} was not held ({a['status']}); its shape is accepted as it is"
    return f"{a['nodeId']} accepted → {a['status']}"


def _replaced(b: dict[str, Any], a: dict[str, Any], _: bool) -> str:
    return (
        f"{a['newNodeId']} replaces {a['oldNodeId']} ({a['status']}); reservations moved:"
        f" {', '.join(a['moved']) or 'none'}; ended: {', '.join(a['ended']) or 'none'}"
    )


_SAY: dict[str, Callable[[dict[str, Any], dict[str, Any], bool], str]] = {
    "tenants.create": lambda b, a, _: f"tenant {a['tenantId']} created ({a.get('name')})",
    "apiKeys.create": lambda b, a, _: (
        f"key {a['keyId']} for {a['tenantId']} ({','.join(a.get('roles', []))}), shown once:\n"
        f"{a['key']}"
    ),
    "apiKeys.revoke": lambda b, a, _: f"key {a['keyId']} revoked",
    "pools.create": lambda b, a, _: f"pool {a['name']} created for {a['owner']}: {a['poolId']}",
    "pools.offer": lambda b, a, _: f"pool {a['name']} offered to {body_or(a.get('offeredTo'))}",
    "pools.unoffer": lambda b, a, _: (
        f"pool {a['name']} no longer offered to {b.get('offerTo')}"
        f" (offered to: {body_or(a.get('offeredTo'))})"
    ),
    "pools.archive": lambda b, a, _: f"pool {a['name']} archived",
    "projects.create": lambda b, a, _: (
        f"project {a['name']} created for {a['tenantId']}: {a['projectId']}"
    ),
    "nodes.setMaintenance": _maintenance,
    "nodes.setExpectedShape": _shape,
    "nodes.acceptShape": _accepted,
    "nodes.replace": _replaced,
    "quotas.set": _quota,
    "reservations.create": _reservation(""),
    "reservations.release": _reservation("→ "),
    "reservations.renew": _reservation("renewed, "),
    "reservations.extend": _extended,
}


def body_or(values: Any) -> str:
    return ", ".join(values) if values else "nobody"


def short_answer(method: str, body: dict[str, Any], answer: Any, local: bool = False) -> str | None:
    say = _SAY.get(method)
    if say is None or not isinstance(answer, dict):
        return None
    try:
        return say(body, answer, local)
    except (KeyError, TypeError):  # an answer of another shape: show it whole instead
        return None


def show_answer(session: Session, method: str, body: dict[str, Any], answer: Any) -> None:
    """A write's one line on a terminal; any other answer as a table (`-o table|wide`),
    CSV, or the API's JSON (piped, `-o json`)."""
    from ops.cli.generic import generic_view

    # The server's strings made inert before the line is composed of them.
    text = short_answer(method, body, shown_values(answer), session.local)
    if text is not None and session.format in ("table", "wide"):
        session.say(text)
    elif session.format == "json":
        session.printer.json(answer)
    else:
        session.show(generic_view(answer, session.local))
