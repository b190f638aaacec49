"""`gpufleet`: the operator and tenant command line.

Read commands (`pools`, `nodes`, `node`, `reservations`, `reservation`, `tenants`,
`keys`, `usage`, `summary`, `watch`, `alerts watch`) print tables on a terminal and JSON
when piped (`-o table|wide|json|csv`); writes answer in one line. Every API method is
also a command under `gpufleet api`, its flags generated from the method's input schema
(`ops/openapi.json`, see `ops.api_spec`); `gpufleet call METHOD JSON` sends a raw body.
A tenant key acts for its own tenant without naming it. Errors are one line naming the
URL, the code and the failing field; exit 1 (API or connection), 2 (usage).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

import click

from ops import views
from ops.api_commands import api_group, call_cmd
from ops.cli_options import (
    output_options,
    pass_session,
    settings_from,
    settings_options,
    show_answer,
    tenant_option,
)
from ops.cli_settings import CliSettings
from ops.client import ApiError, ClientError, Unreachable
from ops.flags import parse_when
from ops.forwarder.command import forward_cmd
from ops.nats_auth import nats_auth_cmd
from ops.session import Session
from ops.slurm_command import slurm_group
from shared.ids import CROCKFORD
from shared.reservation_states import LIVE_STATES, RESERVATION_STATES

STATES = (*RESERVATION_STATES, "live")
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def new_key() -> str:
    key_id = "".join(secrets.choice(CROCKFORD) for _ in range(16))
    return f"gpf_{key_id}_{secrets.token_urlsafe(32)}"


def version() -> str:
    try:
        return metadata.version("gpufleet")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@click.group(context_settings=CONTEXT, help=__doc__)
@settings_options(CliSettings, only=CliSettings.API_FLAGS)
@click.version_option(version(), "--version", prog_name="gpufleet")
@output_options
@click.pass_context
def cli(ctx: click.Context) -> None:
    session = ctx.ensure_object(Session)
    settings = settings_from(ctx, CliSettings, session.env)
    session.url, session.key, session.timeout_s = settings.url, settings.key, settings.timeout_s


# --- read views ---------------------------------------------------------------------


@cli.command("pools")
@tenant_option
@output_options
@pass_session
def pools_cmd(session: Session, tenant: str | None) -> None:
    """Pools the tenant owns or is offered (operators: every pool) with their GPUs."""
    session.show(views.pools(session, session.tenant(tenant, required=False)))


@cli.command("summary")
@click.argument("tenant", required=False)
@output_options
@pass_session
def summary_cmd(session: Session, tenant: str | None) -> None:
    """Capacity per pool and resource, in every bucket (operators: the whole fleet)."""
    session.show(views.summary(session, session.tenant(tenant, required=False)))


@cli.command("nodes")
@click.option("-p", "--pool", metavar="POOL", help="one pool's nodes (its name or id)")
@tenant_option
@output_options
@pass_session
def nodes_cmd(session: Session, pool: str | None, tenant: str | None) -> None:
    """Nodes with their status, health and GPUs (every pool the key sees, or one)."""
    who = session.tenant(tenant, required=False)
    session.show(views.nodes(session, who, views.pool_id(session, who, pool)))


@cli.command("node")
@click.argument("node_id", metavar="NODE_ID")
@tenant_option
@output_options
@pass_session
def node_cmd(session: Session, node_id: str, tenant: str | None) -> None:
    """One node: its state and every GPU, MIG instance, slot, NIC and disk with health,
    bucket and the reservation holding it."""
    session.show(views.node(session, node_id, session.tenant(tenant, required=False)))


@cli.command("reservations")
@click.option(
    "-s", "--state", multiple=True, metavar="STATE", type=click.Choice(STATES),
    help=f"only these states now (repeatable; live: {', '.join(LIVE_STATES)})",
)  # fmt: skip
@click.option("-p", "--pool", metavar="POOL", help="a pool's name or id")
@click.option("--project", metavar="PROJECT_ID")
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
    body: dict[str, Any] = {"state": sorted(set(states))}
    who = session.tenant(tenant, required=False)
    pool = views.pool_id(session, who, pool)
    for key, value in (("tenantId", who), ("poolId", pool), ("projectId", project)):
        if value:
            body[key] = value
    if from_:
        body["from"] = parse_when(from_)
    if to:
        body["to"] = parse_when(to)
    session.show(views.reservations(session, body, limit))


@cli.command("reservation")
@click.argument("reservation_id", metavar="RESERVATION_ID")
@tenant_option
@output_options
@pass_session
def reservation_cmd(session: Session, reservation_id: str, tenant: str | None) -> None:
    """One reservation with its state and atoms (operators: any tenant's)."""
    who = session.tenant(tenant, required=False)
    session.show(views.reservation(session, reservation_id, who))


@cli.command("tenants")
@output_options
@pass_session
def tenants_cmd(session: Session) -> None:
    """Every tenant, its pools and live keys (operator)."""
    session.show(views.tenants(session))


@cli.command("keys")
@click.argument("tenant", required=False)
@click.option("--revoked", is_flag=True, help="include revoked keys")
@output_options
@pass_session
def keys_cmd(session: Session, tenant: str | None, revoked: bool) -> None:
    """API keys of a tenant, or of every tenant (operator); never the secret."""
    session.show(views.keys(session, tenant, revoked))


@cli.command("usage")
@click.option("--from", "from_", metavar="TIME", help="window start (default: 30 days before --to)")
@click.option("--to", metavar="TIME", help="window end (default: now)")
@click.option("-p", "--pool", metavar="POOL", help="a pool's name or id")
@click.option("--project", metavar="PROJECT_ID")
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
    hours and efficiency (used / booked); `-o csv` for billing."""
    body: dict[str, Any] = {"byReservation": True} if by_reservation else {}
    who = session.tenant(tenant, required=False)
    pool = views.pool_id(session, who, pool)
    for key, value in (("tenantId", who), ("poolId", pool), ("projectId", project)):
        if value:
            body[key] = value
    if from_:
        body["from"] = parse_when(from_)
    if to:
        body["to"] = parse_when(to)
    session.show(views.usage(session, body))


@cli.command("watch")
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
    from ops import top

    top.run(session, session.tenant(tenant, required=False), pool, interval, count)


@cli.group("alerts")
def alerts_group() -> None:
    """Alerts the coordinator publishes on NATS (kept in a JetStream stream)."""


alerts_group.add_command(forward_cmd)
cli.add_command(nats_auth_cmd)
cli.add_command(slurm_group)


@alerts_group.command("watch")
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

    from ops.alert_feed import Feed, FeedError, alert_line, follow
    from ops.output import format_time, with_times

    s = settings_from(click.get_current_context(), CliSettings, session.env)
    printer = session.printer
    feed = Feed(
        s.nats_url, s.subject_prefix, s.nats_credentials, pool,
        parse_when(since) if since else None, count, idle,
    )  # fmt: skip

    def show(alert: dict[str, Any]) -> None:
        if printer.fmt in ("json", "csv"):
            printer.out.write(json.dumps(with_times(alert, session.local)) + "\n")
        else:
            printer.out.write(alert_line(alert, format_time(alert.get("at"), session.local)) + "\n")
        printer.out.flush()

    try:
        asyncio.run(follow(feed, show))
    except FeedError as exc:
        raise Failure(str(exc)) from None


# --- writes -------------------------------------------------------------------------


def _write(session: Session, method: str, body: dict[str, Any]) -> None:
    show_answer(session, method, body, session.call(method, body))


@cli.command("maintenance")
@click.argument("node_id", metavar="NODE_ID")
@click.option("--off", is_flag=True, help="end maintenance")
@click.option("--reason", default="", help="why (required to enter maintenance)")
@output_options
@pass_session
def maintenance_cmd(session: Session, node_id: str, off: bool, reason: str) -> None:
    """Put a node in or out of maintenance (operator)."""
    _write(session, "nodes.setMaintenance",
           {"nodeId": node_id, "maintenance": not off, "reason": reason})  # fmt: skip


@cli.command("expected-shape")
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


@cli.command("accept-shape")
@click.argument("node_id", metavar="NODE_ID")
@output_options
@pass_session
def accept_shape_cmd(session: Session, node_id: str) -> None:
    """Accept a node held for exceeding its expected shape, as it is (operator)."""
    _write(session, "nodes.acceptShape", {"nodeId": node_id})


@cli.command("tenant-create")
@click.argument("tenant_id", metavar="TENANT_ID")
@click.option("--name")
@output_options
@pass_session
def tenant_create_cmd(session: Session, tenant_id: str, name: str | None) -> None:
    """Create a tenant (operator)."""
    _write(session, "tenants.create", {"tenantId": tenant_id} | ({"name": name} if name else {}))


@cli.command("key-create")
@click.argument("tenant_id", metavar="TENANT_ID")
@click.option("--role", multiple=True, type=click.Choice(("tenant", "operator")))
@click.option("--label", default="")
@output_options
@pass_session
def key_create_cmd(session: Session, tenant_id: str, role: tuple[str, ...], label: str) -> None:
    """Create an API key for a tenant (operator); it is shown once."""
    body = {"tenantId": tenant_id, "roles": list(role) or ["tenant"], "label": label}
    _write(session, "apiKeys.create", body)


@cli.command("pool-create")
@click.argument("tenant_id", metavar="OWNER")
@click.argument("name", metavar="NAME")
@click.option("--gpu-model")
@output_options
@pass_session
def pool_create_cmd(session: Session, tenant_id: str, name: str, gpu_model: str | None) -> None:
    """Create a pool owned by a tenant (operator)."""
    body = {"tenantId": tenant_id, "name": name} | ({"gpuModel": gpu_model} if gpu_model else {})
    _write(session, "pools.create", body)


@cli.command("pool-offer")
@click.argument("owner", metavar="OWNER")
@click.argument("pool_id", metavar="POOL_ID")
@click.argument("offer_to", metavar="TENANT")
@output_options
@pass_session
def pool_offer_cmd(session: Session, owner: str, pool_id: str, offer_to: str) -> None:
    """Offer a pool to another tenant (its owner, or an operator for it)."""
    _write(session, "pools.offer", {"tenantId": owner, "poolId": pool_id, "offerTo": offer_to})


cli.add_command(api_group)
cli.add_command(call_cmd)


# --- local tools ----------------------------------------------------------------------


@cli.command("demo")
@click.option("--state-dir", help="keep the SQLite ledger and logs here")
@click.option("--port", type=int, default=0, help="API port (default: a free one)")
@click.option("--interval", type=float, default=2.0, show_default=True,
              help="agent heartbeat seconds")  # fmt: skip
@click.option("--agents", type=click.IntRange(1, 4), default=4, show_default=True)
@click.option("--duration", type=float, help="stop after this many seconds")
def demo_cmd(
    state_dir: str | None, port: int, interval: float, agents: int, duration: float | None
) -> None:
    """Run nats-server, a coordinator and simulated agents on this machine."""
    from ops.demo import DemoSettings, run_demo

    code = run_demo(DemoSettings(state_dir, port, interval, duration, agents))
    if code:
        raise SystemExit(code)


@cli.command("new-key")
def new_key_cmd() -> None:
    """Print a fresh key for --bootstrap-operator-key (or GPUFLEET_BOOTSTRAP_OPERATOR_KEY)."""
    click.echo(new_key())


@cli.command("completion")
@click.argument("shell", type=click.Choice(("bash", "zsh", "fish")))
def completion_cmd(shell: str) -> None:
    """Print the shell completion script: bash `source <(gpufleet completion bash)`; zsh
    `gpufleet completion zsh > ~/.zfunc/_gpufleet`; fish `gpufleet completion fish >
    ~/.config/fish/completions/gpufleet.fish`."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    click.echo(cls(cli, {}, "gpufleet", "_GPUFLEET_COMPLETE").source())


# --- entry point ----------------------------------------------------------------------


class Failure(click.ClickException):
    """A problem the user can act on, said in one line (exit 1)."""

    exit_code = 1


def _fail(text: str, code: int) -> int:
    sys.stderr.write(f"gpufleet: {text}\n")
    sys.stderr.flush()
    return code


def run(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> int:
    """The command line; `env`'s `GPUFLEET_*` settings (when given) sit below flags and
    the process environment."""
    session = Session(env={**(env or {}), **os.environ})
    try:
        try:
            cli.main(
                args=list(argv or []), prog_name="gpufleet", standalone_mode=False, obj=session
            )
            sys.stdout.flush()
        except click.exceptions.Exit as exc:
            return int(exc.exit_code)
        except SystemExit as exc:  # a subcommand's own exit status (demo, nats-auth)
            return exc.code if isinstance(exc.code, int) else 1
        except click.exceptions.Abort:
            return _fail("interrupted", 130)
        except click.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # click 8.2+: `gpufleet` alone
                sys.stderr.write(exc.format_message() + "\n")  # the help, as click shows it
                return 2
            hint = f" (see {exc.ctx.command_path} -h)" if exc.ctx is not None else ""
            return _fail(f"{exc.format_message()}{hint}", 2)
        except click.ClickException as exc:
            return _fail(exc.format_message(), exc.exit_code)
        except ApiError as exc:
            return _fail(exc.one_line(), 1)
        except Unreachable as exc:
            return _fail(f"cannot reach the coordinator at {exc.url}: {exc.why}", 1)
        except ClientError as exc:
            return _fail(str(exc), 1)
        except KeyboardInterrupt:
            return _fail("interrupted", 130)
    except BrokenPipeError:
        # The reader went away (`gpufleet summary | head`): stop quietly, as cat would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return 0


def main() -> int:
    return run(sys.argv[1:], os.environ)


if __name__ == "__main__":
    sys.exit(main())
