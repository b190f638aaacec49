"""The options and plumbing every `gpufleet` command shares: `-o/--local` accepted
before or after the command, `-t/--tenant`, the session passed to each command, and the
click options of a settings model (`procs.settings`, the daemons' own)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import click

from ops.kit.output import FORMATS
from ops.kit.session import Session
from procs.settings import (
    ConfigError,
    SettingsModel,
    from_sources,
    given_flags,
    settings_options,
)

__all__ = [
    "output_options",
    "pass_session",
    "settings_from",
    "settings_options",
    "tenant_option",
]

M = TypeVar("M", bound=SettingsModel)


def settings_from(ctx: click.Context, model: type[M], env: Mapping[str, str]) -> M:
    """`model`'s settings: the TOML file, then `env`, then the flags given; a bad value is
    a usage error (exit 2) naming the field."""
    try:
        return from_sources(model, given_flags(ctx, model), env)
    except ConfigError as exc:
        raise click.UsageError(f"config error: {exc}") from None


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
