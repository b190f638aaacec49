"""The options and plumbing every `gpufleet` command shares: `-o/--local` accepted
before or after the command, `-t/--tenant`, the session passed to each command, how a
write's answer is shown (one line on a terminal, the JSON when piped), and the click
options of a settings model (`shared.settings`, the daemons' mechanism)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from ops.answers import short_answer
from ops.output import FORMATS
from ops.session import Session
from shared.settings import (
    ConfigError,
    FlagSpec,
    SettingsModel,
    config_help,
    flag_specs,
    from_sources,
)

__all__ = [
    "output_options",
    "pass_session",
    "settings_from",
    "settings_options",
    "show_answer",
    "tenant_option",
]

M = TypeVar("M", bound=SettingsModel)
# ctx.meta (shared by a command and its subcommands): the settings flags given, by model,
# then by field name; `gpufleet --config A alerts forward --config B` reads A for the
# CLI's settings and B for the forwarder's.
_GIVEN = "gpufleet.settings-flags"


def _keep(
    model: type[SettingsModel], dest: str
) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, _: click.Parameter, value: Any) -> None:
        if value is not None and value != ():
            ctx.meta.setdefault(_GIVEN, {}).setdefault(model, {})[dest] = value

    return callback


def _option(model: type[SettingsModel], spec: FlagSpec) -> Callable[[Any], Any]:
    kwargs: dict[str, Any] = {
        "help": spec.help, "default": None, "expose_value": False,
        "callback": _keep(model, spec.dest),
    }  # fmt: skip
    names = list(spec.names)
    if spec.style == "switch":
        names = [f"{names[0]}/--no-{names[0].removeprefix('--')}", *names[1:]]
    elif spec.style == "repeat":
        kwargs |= {"multiple": True, "metavar": spec.metavar}
    elif spec.style == "choice":
        kwargs["type"] = click.Choice(spec.choices, case_sensitive=False)
    else:
        kwargs["metavar"] = spec.metavar
    return click.option(*names, **kwargs)


def settings_options(
    model: type[SettingsModel], only: tuple[str, ...] | None = None, config: bool = True
) -> Callable[[Any], Any]:
    """The flags of `model` (or of its fields named in `only`), generated as the daemons'
    argparse flags are (`shared.settings.flag_specs`), and `--config`; `settings_from`
    builds the settings from them."""

    def decorate(f: Any) -> Any:
        for spec in reversed(list(flag_specs(model))):
            if only is None or spec.dest in only:
                f = _option(model, spec)(f)
        if not config:
            return f
        return click.option(
            "--config", metavar="PATH", help=config_help(model), expose_value=False,
            callback=_keep(model, "config"),
        )(f)  # fmt: skip

    return decorate


def settings_from(ctx: click.Context, model: type[M], env: Mapping[str, str]) -> M:
    """`model`'s settings: the TOML file, then `env`, then the flags given; a bad value is
    a usage error (exit 2) naming the field."""
    try:
        return from_sources(model, ctx.meta.get(_GIVEN, {}).get(model, {}), env)
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


def show_answer(session: Session, method: str, body: dict[str, Any], answer: Any) -> None:
    text = short_answer(method, body, answer, session.local)
    if text is not None and session.format in ("table", "wide"):
        session.say(text)
    else:
        session.printer.json(answer)
