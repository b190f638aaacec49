"""The daily verbs: `reserve` (a booking from flags, printing what it booked), `extend`
(a booking's end, `--dry-run` first if wanted, or a leased booking's lease), `release`,
and `maintenance` with `--dry-run` (the bookings it would put at risk, nothing changed).
Each is one API call (two where the key names no tenant and the reservation's is looked
up, or an end moved by --by needs the old one), answered in one line on a terminal and
as the API's JSON when piped."""

from __future__ import annotations

import secrets
from typing import Any

import click

from ops.cli import views
from ops.cli.answers import count, show_answer
from ops.cli.fleet_views import models_matching, pool_models
from ops.kit.options import output_options, pass_session, tenant_option
from ops.kit.output import Section, View
from ops.kit.session import Session
from shared.reservation_states import LIVE_STATES

_DURATION_HELP = "how long: 90m, 2h, 1d, PT2H or seconds"


def _write(session: Session, method: str, body: dict[str, Any]) -> None:
    show_answer(session, method, body, session.call(method, body))


def _owner(session: Session, tenant: str | None, reservation_id: str) -> str:
    """The tenant a reservation is acted on for: the one named, the key's own, or (an
    operator key naming none) the reservation's own."""
    who = session.tenant(tenant, required=False)
    if who is not None:
        return who
    found = session.call("reservations.get", {"reservationId": reservation_id})
    return str(found["tenantId"])


@click.command("reserve")
@click.option("-p", "--pool", metavar="POOL", required=True, help="the pool (its name or id)")
@click.option("-n", "--count", type=click.IntRange(1, 64), default=1, show_default=True,
              help="how many devices")  # fmt: skip
@click.option("--class", "cls", default="gpu", show_default=True, metavar="CLASS",
              help="the device class: gpu, gpu.mig, gpu.slot, nic.vf, disk, node")  # fmt: skip
@click.option("-m", "--model", metavar="MODEL", help="only devices of this model (e.g. H100)")
@click.option("--start", metavar="TIME", help="when it starts (default: now; e.g. +1h, RFC 3339)")
@click.option("--end", metavar="TIME", help="when it ends (or give --duration)")
@click.option("-d", "--duration", metavar="DURATION", help=_DURATION_HELP)
@click.option("--project", metavar="PROJECT", help="book under this project (name or id)")
@click.option("--lease", type=click.IntRange(30, 86400), metavar="SECONDS",
              help="a lease: it lapses unless renewed (gpufleet extend) in time")  # fmt: skip
@click.option("--spot", is_flag=True, help="preemptible, at a notice")
@click.option("--wait", type=click.FloatRange(0, 30), metavar="SECONDS",
              help="wait up to this long for capacity before refusing")  # fmt: skip
@click.option("--idempotency-key", metavar="KEY",
              help="names the booking for retries (default: a fresh one)")  # fmt: skip
@tenant_option
@output_options
@pass_session
def reserve_cmd(
    session: Session, pool: str, count: int, cls: str, model: str | None, start: str | None,
    end: str | None, duration: str | None, project: str | None, lease: int | None, spot: bool,
    wait: float | None, idempotency_key: str | None, tenant: str | None,
) -> None:  # fmt: skip
    """Book devices in a pool, e.g. `gpufleet reserve -p h100-east -n 2 -d 4h`; prints
    the reservation, its devices, nodes and times."""
    from ops.cli.flags import parse_when

    if (end is None) == (duration is None):
        raise click.UsageError("give --duration or --end (one of them)")
    who = session.tenant(tenant)
    pool_id = session.pool_id(who, pool)
    device: dict[str, Any] = {"class": cls, "count": count}
    if model:
        device["selector"] = {"model": _models(session, who, pool_id, model)}
    body: dict[str, Any] = {
        "tenantId": who, "poolId": pool_id, "devices": [device],
        "idempotencyKey": idempotency_key or f"cli-{secrets.token_hex(8)}",
    }  # fmt: skip
    now = parse_when("now")
    begin = parse_when(start, now) if start else None
    if begin is not None:
        body["start"] = begin
    if duration is not None:
        body["duration"] = int(duration) if duration.isdigit() else duration
    else:
        assert end is not None
        # Without --start it begins now: said outright, so the length is exact.
        body["start"] = begin = now if begin is None else begin
        seconds, rest = divmod(parse_when(end, now) - begin, 1000)
        if seconds <= 0 or rest:
            raise click.BadParameter("must be whole seconds after the start", param_hint="--end")
        body["duration"] = seconds
    project = session.project_id(who, project)
    for key, value in (("projectId", project), ("leaseSeconds", lease)):
        if value is not None:
            body[key] = value
    if spot:
        body["spot"] = True
    if wait:
        body["wait"] = {"timeoutMs": int(wait * 1000)}
    _write(session, "reservations.create", body)


def _models(session: Session, tenant: str | None, pool_id: str | None, given: str) -> list[str]:
    """A --model as the models the pool's GPUs report (`H100` → `NVIDIA H100 80GB HBM3`)."""
    known = pool_models(session, tenant, pool_id)
    found = models_matching(given, known)
    if not found:
        there = ", ".join(sorted(set(known))) or "none reported"
        raise click.BadParameter(f"no GPU model {given!r} in that pool (it has: {there})",
                                 param_hint="--model")  # fmt: skip
    return found


@click.command("extend")
@click.argument("reservation_id", metavar="RESERVATION_ID")
@click.option("--until", metavar="TIME",
              help="move its end to this time (e.g. +6h from now, RFC 3339)")  # fmt: skip
@click.option("--by", metavar="DURATION", help=f"move its end later by this; {_DURATION_HELP}")
@click.option("--lease", type=click.IntRange(30, 86400), metavar="SECONDS",
              help="renew its lease from now, this long (default: its own)")  # fmt: skip
@click.option("--dry-run", is_flag=True,
              help="say whether it could be moved; change nothing")  # fmt: skip
@tenant_option
@output_options
@pass_session
def extend_cmd(
    session: Session, reservation_id: str, until: str | None, by: str | None,
    lease: int | None, dry_run: bool, tenant: str | None,
) -> None:  # fmt: skip
    """Move a reservation's end (--until TIME or --by DURATION) on the same devices,
    printing the old and new end; without either, renew a leased reservation's lease
    from now (its own length, or --lease)."""
    if until is not None and by is not None:
        raise click.UsageError("give --until or --by, not both")
    if until is None and by is None:
        if dry_run:
            raise click.UsageError("--dry-run goes with --until or --by")
        body: dict[str, Any] = {
            "tenantId": _owner(session, tenant, reservation_id),
            "reservationId": reservation_id,
        }
        if lease is not None:
            body["leaseSeconds"] = lease
        _write(session, "reservations.renew", body)
        return
    if lease is not None:
        raise click.UsageError("--lease renews a lease; give it without --until/--by")
    who = session.tenant(tenant, required=False)
    found = session.call(
        "reservations.get", {"reservationId": reservation_id} | ({"tenantId": who} if who else {})
    )
    body = {"tenantId": who or str(found["tenantId"]), "reservationId": reservation_id,
            "end": _new_end(found, until, by)}  # fmt: skip
    if dry_run:
        body["dryRun"] = True
    _write(session, "reservations.extend", body)


def _new_end(found: dict[str, Any], until: str | None, by: str | None) -> int:
    from ops.cli.flags import parse_when
    from shared.durations import DurationError, parse_duration

    if until is not None:
        return parse_when(until)
    assert by is not None
    try:
        seconds = parse_duration(int(by) if by.isdigit() else by)
    except DurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--by") from None
    return int(found["end"]) + seconds * 1000


@click.command("release")
@click.argument("reservation_id", metavar="RESERVATION_ID")
@tenant_option
@output_options
@pass_session
def release_cmd(session: Session, reservation_id: str, tenant: str | None) -> None:
    """End a reservation now; the rest of its time is free at once."""
    body = {"tenantId": _owner(session, tenant, reservation_id), "reservationId": reservation_id}
    _write(session, "reservations.release", body)


@click.command("maintenance")
@click.argument("node_id", metavar="NODE_ID")
@click.option("--off", is_flag=True, help="end maintenance")
@click.option("--reason", default="", help="why (required to enter maintenance)")
@click.option("--dry-run", is_flag=True,
              help="list the bookings it would put at risk; change nothing")  # fmt: skip
@output_options
@pass_session
def maintenance_cmd(session: Session, node_id: str, off: bool, reason: str, dry_run: bool) -> None:
    """Put a node in or out of maintenance (operator); --dry-run first shows whose
    bookings it would put at risk."""
    if dry_run:
        session.show(_at_risk_preview(session, node_id, off))
        return
    _write(session, "nodes.setMaintenance",
           {"nodeId": node_id, "maintenance": not off, "reason": reason})  # fmt: skip


def _at_risk_preview(session: Session, node_id: str, off: bool) -> View:
    """What `maintenance NODE` would do, read only: the node as it is and every live
    reservation booked on it (each is put at risk by maintenance, SPEC §5)."""
    node = session.call("nodes.get", {"nodeId": node_id})
    state = node["state"]["maintenance"]
    query = {"nodeId": node_id, "state": list(LIVE_STATES), "limit": 200}
    found = [r for page in session.pages("reservations.list", query) for r in page["reservations"]]
    if off:
        verb = "out of maintenance" if state["value"] else "out of maintenance (it is not in it)"
        line = f"dry run: {node_id} → {verb}; {count(len(found), 'reservation')} on it"
    else:
        already = " (it already is)" if state["value"] else ""
        line = (
            f"dry run: {node_id} → maintenance{already} would put "
            f"{count(len(found), 'reservation')} at risk; nothing changed"
        )
    data = {
        "nodeId": node_id, "dryRun": True, "maintenance": not off,
        "maintenanceNow": bool(state["value"]), "reservations": found,
    }  # fmt: skip
    rows = [views.reservation_row(r) for r in found]
    return View(data, [Section(views.RESERVATION_COLUMNS, rows, empty="no bookings on it")], [line])


COMMANDS: tuple[click.Command, ...] = (reserve_cmd, extend_cmd, release_cmd, maintenance_cmd)
