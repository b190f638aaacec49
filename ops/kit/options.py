"""The options every `gpufleet` command shares: `-o/--local` accepted before or after
the command, `-t/--tenant`, and the session passed to each command. (The click options
of a settings model are `procs.settings.commands`': `settings_options`, `settings_from`.)"""

from __future__ import annotations

from typing import Any

import click

from ops.kit.output import FORMATS
from ops.kit.session import Session

__all__ = ["output_options", "pass_session", "tenant_option"]


def _set(attr: str) -> Any:
    def callback(ctx: click.Context, _: click.Parameter, value: Any) -> None:
        if value is not None and value is not False:
            setattr(ctx.ensure_object(Session), attr, value)

    return callback


def output_options(f: Any) -> Any:
    """-o and --local on every command as well as before it (`gpufleet pools -o json`)."""
    f = click.option(
        "-o", "--output", type=click.Choice(FORMATS), expose_value=False, callback=_set("fmt"),
        help="table (default on a terminal), wide, json (default when piped) or csv",
    )(f)  # fmt: skip
    return click.option(
        "--local", is_flag=True, expose_value=False, callback=_set("local"),
        help="times in local time (default: UTC)",
    )(f)  # fmt: skip


def tenant_option(f: Any) -> Any:
    return click.option(
        "-t", "--tenant", metavar="TENANT",
        help="act for this tenant (default: the key's own; operator keys: every tenant)",
    )(f)  # fmt: skip


pass_session = click.make_pass_decorator(Session, ensure=True)
