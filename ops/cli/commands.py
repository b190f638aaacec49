"""The CLI tool's commands: the read views (tables on a terminal, JSON when piped), the
writes (one line each), `alerts watch`, and every API method under `gpufleet api`.
`ops.main` mounts them on the `gpufleet` group, which sets up the session they share."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ops.cli import daily, fleet_views, focus_parquet, views
from ops.cli.answers import show_answer
from ops.cli.api_commands import api_group, call_cmd
from ops.cli.flags import parse_when
from ops.cli.fleet_views import GPU_STATES, USE_STATES, labels_option, parse_labels
from ops.cli.settings import CliSettings
from ops.kit.keys import new_key
from ops.kit.options import output_options, pass_session, tenant_option
from ops.kit.session import Session
from procs.settings.commands import settings_from, settings_options
from shared.reservation_states import LIVE_STATES, RESERVATION_STATES

STATES = (*RESERVATION_STATES, "live")


# --- read views ---------------------------------------------------------------------


@click.command("pools")
@tenant_option
@output_options
@pass_session
def pools_cmd(session: Session, tenant: str | None) -> None:
    """Pools the tenant owns or is offered (operators: every pool) with their GPUs."""
    session.show(views.pools(session, session.tenant(tenant, required=False)))


@click.command("summary")
@click.argument("tenant", required=False)
@output_options
@pass_session
def summary_cmd(session: Session, tenant: str | None) -> None:
    """Capacity per pool and resource, in every bucket (operators: the whole fleet, also
    as `summary operator`, the operator key's own tenant)."""
    who = session.tenant(tenant, required=False)
    if who is not None and session.operator and who == session.me().get("tenantId"):
        who = None  # the operator's own tenant owns no pools: it means the whole fleet
    session.show(views.summary(session, who))


@click.command("nodes")
@click.option("-p", "--pool", metavar="POOL", help="one pool's nodes (its name or id)")
@click.option(
    "-s", "--state", multiple=True, metavar="STATUS",
    help="only nodes in this status, as the STATUS column shows it (repeatable)",
)  # fmt: skip
@labels_option
@tenant_option
@output_options
@pass_session
def nodes_cmd(
    session: Session, pool: str | None, state: tuple[str, ...], labels: tuple[str, ...],
    tenant: str | None,
) -> None:  # fmt: skip
    """Nodes with their status, health and GPUs: how many, held (USED), free to book
    (FREE) and running a process (BUSY); every pool the key sees, or one."""
    wanted = parse_labels(labels)
    who = session.tenant(tenant, required=False)
    session.show(fleet_views.nodes(session, who, session.pool_id(who, pool), state, wanted))


@click.command("gpus")
@click.option("-p", "--pool", metavar="POOL", help="one pool's GPUs (its name or id)")
@click.option("-m", "--model", multiple=True, metavar="MODEL",
              help="only this GPU model (repeatable; any case)")  # fmt: skip
@click.option(
    "-s", "--state", multiple=True, type=click.Choice(GPU_STATES + USE_STATES),
    help="only GPUs in these states (repeatable): free, held or a hold; busy, idle, "
    "or unbooked (busy without a booking)",
)  # fmt: skip
@labels_option
@tenant_option
@output_options
@pass_session
def gpus_cmd(
    session: Session, pool: str | None, model: tuple[str, ...], state: tuple[str, ...],
    labels: tuple[str, ...], tenant: str | None,
) -> None:  # fmt: skip
    """Every GPU and MIG instance in the fleet (or a pool): its state, holder and what
    runs on it (USE, SM %, MEMORY and USERS, as nvidia-smi shows processes)."""
    from ops.cli.fleet_views import gpus

    wanted = parse_labels(labels)
    who = session.tenant(tenant, required=False)
    session.show(gpus(session, who, session.pool_id(who, pool), model, state, wanted))


@click.command("node")
@click.argument("node_id", metavar="NODE_ID")
@tenant_option
@output_options
@pass_session
def node_cmd(session: Session, node_id: str, tenant: str | None) -> None:
    """One node: its state and every GPU, MIG instance, slot, NIC and disk with health,
    bucket and the reservation holding it."""
    session.show(views.node(session, node_id, session.tenant(tenant, required=False)))


@click.command("reservations")
@click.option(
    "-s", "--state", multiple=True, metavar="STATE", type=click.Choice(STATES),
    help=f"only these states now (repeatable; live: {', '.join(LIVE_STATES)})",
)  # fmt: skip
@click.option("-p", "--pool", metavar="POOL", help="a pool's name or id")
@click.option("--project", metavar="PROJECT", help="a project's name or id")
@click.option("--from", "from_", metavar="TIME", help="overlapping this window (e.g. -7d)")
@click.option("--to", metavar="TIME")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@tenant_option
@output_options
@pass_session
def reservations_cmd(
    session: Session, state: tuple[str, ...], pool: str | None, project: str | None,
    from_: str | None, to: str | None, limit: int, tenant: str | None,
) -> None:  # fmt: skip
    """Reservations, newest first (operators: every tenant's unless --tenant)."""
    states = [s for s in state if s != "live"]
    if "live" in state:
        states += LIVE_STATES
    body = {"state": sorted(set(states))} | _filters(session, tenant, pool, project, from_, to)
    session.show(views.reservations(session, body, limit))


def _filters(
    session: Session, tenant: str | None, pool: str | None, project: str | None,
    from_: str | None, to: str | None,
) -> dict[str, Any]:  # fmt: skip
    """--tenant, --pool, --project, --from and --to as a listing's body: the tenant acted
    for (none: an operator's every tenant), pool and project by name or id, the times
    parsed; what was not given is left out."""
    who = session.tenant(tenant, required=False)
    body: dict[str, Any] = {}
    pool = session.pool_id(who, pool)
    project = session.project_id(who, project)
    for key, value in (("tenantId", who), ("poolId", pool), ("projectId", project)):
        if value:
            body[key] = value
    if from_:
        body["from"] = parse_when(from_)
    if to:
        body["to"] = parse_when(to)
    return body


@click.command("reservation")
@click.argument("reservation_id", metavar="RESERVATION_ID")
@tenant_option
@output_options
@pass_session
def reservation_cmd(session: Session, reservation_id: str, tenant: str | None) -> None:
    """One reservation with its state and atoms (operators: any tenant's)."""
    who = session.tenant(tenant, required=False)
    session.show(views.reservation(session, reservation_id, who))


@click.command("tenants")
@output_options
@pass_session
def tenants_cmd(session: Session) -> None:
    """Every tenant, its pools and live keys (operator)."""
    session.show(views.tenants(session))


@click.command("keys")
@click.argument("tenant", required=False)
@click.option("--revoked", is_flag=True, help="include revoked keys")
@output_options
@pass_session
def keys_cmd(session: Session, tenant: str | None, revoked: bool) -> None:
    """API keys of a tenant, or of every tenant (operator); never the secret."""
    session.show(views.keys(session, tenant, revoked))


@click.group("usage", invoke_without_command=True)
@click.option("--from", "from_", metavar="TIME", help="window start (default: 30 days before --to)")
@click.option("--to", metavar="TIME", help="window end (default: now)")
@click.option("-p", "--pool", metavar="POOL", help="a pool's name or id")
@click.option("--project", metavar="PROJECT", help="a project's name or id")
@click.option(
    "--by-reservation", is_flag=True, help="one row per reservation (booked, used, weighted)"
)
@tenant_option
@output_options
@pass_session
def usage_cmd(
    session: Session, from_: str | None, to: str | None, pool: str | None, project: str | None,
    by_reservation: bool, tenant: str | None,
) -> None:  # fmt: skip
    """GPU-hours (and MIG, slot, VF, disk, node, vCPU and GiB hours) per tenant, pool and
    project, as the bookings ran, with the GPU classes' used and utilization-weighted
    hours and efficiency (used / booked); `-o csv` for billing. `usage export` writes
    FOCUS 1.2 chargeback rows."""
    if click.get_current_context().invoked_subcommand is not None:
        return
    body = {"byReservation": True} if by_reservation else {}
    session.show(views.usage(session, body | _filters(session, tenant, pool, project, from_, to)))


@usage_cmd.command("export")
@click.option(
    "--format", "fmt", type=click.Choice(["focus-csv", "focus-parquet"]), default="focus-csv",
    show_default=True,
    help="FOCUS 1.2 rows as CSV, or Parquet (needs --out and pyarrow: gpufleet[export])",
)  # fmt: skip
@click.option("--from", "from_", metavar="TIME", required=True, help="on the 15-minute grid")
@click.option("--to", metavar="TIME", required=True, help="on the grid, at most 35 days on")
@click.option("-p", "--pool", metavar="POOL", help="a pool's name or id")
@click.option(
    "--out", type=click.Path(dir_okay=False, writable=True), help="file (default: stdout)"
)
@tenant_option
@pass_session
def usage_export_cmd(
    session: Session, fmt: str, from_: str, to: str, pool: str | None, out: str | None,
    tenant: str | None,
) -> None:  # fmt: skip
    """Chargeback as FOCUS 1.2 rows: per 15-minute interval, tenant and pool, reserved
    GPU memory used and unused, and use above it on demand, priced by the coordinator's
    rate card (none: quantities, zero costs), streamed as it comes; focus-parquet
    writes the same rows as Parquet with FOCUS's column types."""
    if fmt == "focus-parquet":
        if out is None:
            raise click.UsageError("focus-parquet writes a file: give --out FILE")
        try:
            focus_parquet.column_types([])
        except focus_parquet.ParquetUnavailable as exc:
            raise click.UsageError(str(exc)) from None
    who = session.tenant(tenant, required=False)
    body: dict[str, Any] = {"format": "focus-csv", "from": parse_when(from_), "to": parse_when(to)}
    for key, value in (("tenantId", who), ("poolId", session.pool_id(who, pool))):
        if value:
            body[key] = value
    if out is None:
        session.client().download("usage.export", body, sys.stdout.buffer)
        return
    if fmt == "focus-parquet":
        with focus_parquet.spool() as csv_file:
            session.client().download("usage.export", body, csv_file)
            csv_file.seek(0)
            focus_parquet.csv_to_parquet(csv_file, out)
        return
    with open(out, "wb") as f:
        session.client().download("usage.export", body, f)


@click.command("watch")
@click.option("-p", "--pool", metavar="POOL", help="a pool id or name (default: every pool)")
@click.option("-n", "--interval", type=click.FloatRange(0.2), default=2.0, show_default=True)
@click.option("--count", type=click.IntRange(1), help="stop after this many frames")
@tenant_option
@output_options
@pass_session
def watch_cmd(
    session: Session, pool: str | None, interval: float, count: int | None, tenant: str | None
) -> None:
    """A `top` for a pool: GPU buckets and every node's state, redrawn."""
    from ops.cli import top

    top.run(session, session.tenant(tenant, required=False), pool, interval, count)


@click.command("watch")
@click.option("-p", "--pool", metavar="POOL_ID", help="only this pool's alerts")
@click.option("--since", metavar="TIME", help="replay from this time (e.g. -1h); default: new only")
@settings_options(CliSettings, only=CliSettings.NATS_FLAGS, config=False)
@click.option("--count", type=click.IntRange(1), help="stop after this many alerts")
@click.option("--idle", type=float, metavar="SECONDS", help="stop after this long without one")
@output_options
@pass_session
def alerts_watch_cmd(
    session: Session, pool: str | None, since: str | None, count: int | None, idle: float | None
) -> None:
    """Follow alerts as they are published (JSON lines when piped)."""
    import asyncio

    from ops.cli.alert_feed import Feed, alert_line, follow
    from ops.kit.output import format_time, with_times

    s = settings_from(click.get_current_context(), CliSettings, session.env)
    printer = session.printer
    feed = Feed(s.nats, pool, parse_when(since) if since else None, count, idle)

    def show(alert: dict[str, Any]) -> None:
        if printer.fmt in ("json", "csv"):
            printer.out.write(json.dumps(with_times(alert, session.local)) + "\n")
        else:
            printer.out.write(alert_line(alert, format_time(alert.get("at"), session.local)) + "\n")
        printer.out.flush()

    asyncio.run(follow(feed, show))


@click.group("projects")
def projects_group() -> None:
    """A tenant's projects: `prj_` ids with names, given to `reserve --project` (a name
    is taken wherever a project id is asked)."""


@projects_group.command("create")
@click.argument("name", metavar="NAME")
@tenant_option
@output_options
@pass_session
def project_create_cmd(session: Session, name: str, tenant: str | None) -> None:
    """Create a project of the tenant; prints its id."""
    body = {"tenantId": session.tenant(tenant), "name": name}
    show_answer(session, "projects.create", body, session.call("projects.create", body))


@projects_group.command("list")
@tenant_option
@output_options
@pass_session
def project_list_cmd(session: Session, tenant: str | None) -> None:
    """The tenant's projects (operators: every tenant's unless --tenant)."""
    who = session.tenant(tenant, required=False)
    session.show(views.projects(session, who))


# --- writes -------------------------------------------------------------------------


def _write(session: Session, method: str, body: dict[str, Any]) -> None:
    show_answer(session, method, body, session.call(method, body))


@click.command("expected-shape")
@click.argument("counts", nargs=-1, metavar="CLASS=COUNT...")
@click.option("-p", "--pool", metavar="POOL_ID", help="for this pool's nodes")
@click.option("--profile", metavar="ID@VERSION", help="for this host profile version's nodes")
@output_options
@pass_session
def expected_shape_cmd(
    session: Session, counts: tuple[str, ...], pool: str | None, profile: str | None
) -> None:
    """Set the atoms per class expected of a pool's or a profile's nodes, e.g. `gpu=8
    nic.vf=32` (operator); none clears it. A node with more is held in provisioning
    until `accept-shape`."""
    body: dict[str, Any] = {"counts": {}}
    for item in counts:
        cls, sep, n = item.partition("=")
        if not sep or not n.isdigit():
            raise click.BadParameter(f"{item!r}: expected CLASS=COUNT", param_hint="COUNTS")
        body["counts"][cls] = int(n)
    if (pool is None) == (profile is None):
        raise click.UsageError("give --pool or --profile")
    if pool is not None:
        body["poolId"] = pool
    else:
        profile_id, sep, version = (profile or "").rpartition("@")
        if not sep or not version.isdigit():
            raise click.BadParameter("expected ID@VERSION", param_hint="--profile")
        body |= {"profileId": profile_id, "profileVersion": int(version)}
    _write(session, "nodes.setExpectedShape", body)


@click.command("accept-shape")
@click.argument("node_id", metavar="NODE_ID")
@output_options
@pass_session
def accept_shape_cmd(session: Session, node_id: str) -> None:
    """Accept a node held for exceeding its expected shape, as it is (operator)."""
    _write(session, "nodes.acceptShape", {"nodeId": node_id})


@click.command("replace-node")
@click.argument("old_node_id", metavar="OLD")
@click.argument("new_node_id", metavar="NEW")
@output_options
@pass_session
def replace_node_cmd(session: Session, old_node_id: str, new_node_id: str) -> None:
    """Say NEW is the host OLD was (operator): OLD's bookings move to NEW where it shows
    the same devices (the others end), OLD is retired, NEW's duplicate hold ends. To keep
    OLD, replace NEW by it: `replace-node NEW OLD`."""
    _write(session, "nodes.replace", {"oldNodeId": old_node_id, "newNodeId": new_node_id})


@click.command("tenant-create")
@click.argument("tenant_id", metavar="TENANT_ID")
@click.option("--name")
@output_options
@pass_session
def tenant_create_cmd(session: Session, tenant_id: str, name: str | None) -> None:
    """Create a tenant (operator)."""
    _write(session, "tenants.create", {"tenantId": tenant_id} | ({"name": name} if name else {}))


@click.command("key-create")
@click.argument("tenant_id", metavar="TENANT_ID")
@click.option("--role", multiple=True, type=click.Choice(("tenant", "operator", "observer")))
@click.option("--label", default="")
@output_options
@pass_session
def key_create_cmd(session: Session, tenant_id: str, role: tuple[str, ...], label: str) -> None:
    """Create an API key for a tenant (operator); it is shown once."""
    body = {"tenantId": tenant_id, "roles": list(role) or ["tenant"], "label": label}
    _write(session, "apiKeys.create", body)


@click.command("pool-create")
@click.argument("tenant_id", metavar="OWNER")
@click.argument("name", metavar="NAME")
@click.option("--gpu-model")
@output_options
@pass_session
def pool_create_cmd(session: Session, tenant_id: str, name: str, gpu_model: str | None) -> None:
    """Create a pool owned by a tenant (operator)."""
    body = {"tenantId": tenant_id, "name": name} | ({"gpuModel": gpu_model} if gpu_model else {})
    _write(session, "pools.create", body)


@click.command("pool-offer")
@click.argument("owner", metavar="OWNER")
@click.argument("pool_id", metavar="POOL_ID")
@click.argument("offer_to", metavar="TENANT")
@output_options
@pass_session
def pool_offer_cmd(session: Session, owner: str, pool_id: str, offer_to: str) -> None:
    """Offer a pool to another tenant (its owner, or an operator for it)."""
    _write(session, "pools.offer", {"tenantId": owner, "poolId": pool_id, "offerTo": offer_to})


# --- local tools ----------------------------------------------------------------------


@click.command("new-key")
def new_key_cmd() -> None:
    """Print a fresh key for --bootstrap-operator-key (or GPUFLEET_BOOTSTRAP_OPERATOR_KEY)."""
    click.echo(new_key())


@click.command("completion")
@click.argument("shell", type=click.Choice(("bash", "zsh", "fish")))
def completion_cmd(shell: str) -> None:
    """Print the shell completion script: bash `source <(gpufleet completion bash)`; zsh
    `gpufleet completion zsh > ~/.zfunc/_gpufleet`; fish `gpufleet completion fish >
    ~/.config/fish/completions/gpufleet.fish`."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    root = click.get_current_context().find_root().command
    click.echo(cls(root, {}, "gpufleet", "_GPUFLEET_COMPLETE").source())


# What `ops.main` mounts: the top-level commands, and `alerts watch` under `alerts`.
COMMANDS: tuple[click.Command, ...] = (
    pools_cmd, summary_cmd, nodes_cmd, node_cmd, reservations_cmd, reservation_cmd,
    tenants_cmd, keys_cmd, usage_cmd, watch_cmd, gpus_cmd, *daily.COMMANDS, expected_shape_cmd,
    accept_shape_cmd, replace_node_cmd, tenant_create_cmd, key_create_cmd, pool_create_cmd,
    pool_offer_cmd, projects_group, api_group, call_cmd, new_key_cmd, completion_cmd,
)  # fmt: skip
ALERT_COMMANDS: tuple[click.Command, ...] = (alerts_watch_cmd,)
