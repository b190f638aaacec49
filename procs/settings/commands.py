"""A settings model's flags as click options, for `gpufleet`'s commands and for a daemon's
command line where it needs click (`-h`, a usage error): `settings_options` adds them to
a command, `given_flags` reads the ones given, `settings_from` builds the settings of a
command, `command` is a daemon's own. Unset flags are never recorded, so they never hide
an env or file value."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click

from procs.settings.flags import HELP_OPTIONS, FlagSpec, config_help, flag_specs
from procs.settings.model import ConfigError, M, SettingsModel
from procs.settings.sources import from_sources
from procs.version import __version__

# click's ctx.meta (shared by a command and its subcommands): the settings flags given, by
# model, then by field name; `gpufleet --config A alerts forward --config B` reads A for
# the CLI's settings and B for the forwarder's.
_GIVEN = "gpufleet.settings-flags"


def _keep(
    model: type[SettingsModel], dest: str
) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, _: click.Parameter, value: Any) -> None:
        if value is not None and value != ():
            ctx.meta.setdefault(_GIVEN, {}).setdefault(model, {})[dest] = value

    return callback


def _option_args(model: type[SettingsModel], spec: FlagSpec) -> tuple[list[str], dict[str, Any]]:
    names = list(spec.names)
    kwargs: dict[str, Any] = {
        "help": spec.help, "default": None, "expose_value": False,
        "callback": _keep(model, spec.dest),
    }  # fmt: skip
    if spec.style == "switch":
        names = [f"{names[0]}/--no-{names[0].removeprefix('--')}", *names[1:]]
    elif spec.style == "repeat":
        kwargs |= {"multiple": True, "metavar": spec.metavar}
    elif spec.style == "choice":
        kwargs["type"] = click.Choice(spec.choices, case_sensitive=False)
    else:
        kwargs["metavar"] = spec.metavar
    return names, kwargs


def _options_args(
    model: type[SettingsModel], only: tuple[str, ...] | None, config: bool
) -> list[tuple[list[str], dict[str, Any]]]:
    """(names, keywords) of each click option, in the order `--help` lists them."""
    out = [_option_args(model, s) for s in flag_specs(model) if only is None or s.dest in only]
    if config:
        config_kwargs: dict[str, Any] = {
            "metavar": "PATH", "help": config_help(model), "expose_value": False,
            "callback": _keep(model, "config"),
        }  # fmt: skip
        out.insert(0, (["--config"], config_kwargs))
    return out


def settings_options(
    model: type[SettingsModel], only: tuple[str, ...] | None = None, config: bool = True
) -> Callable[[Any], Any]:
    """A decorator adding the flags of `model` (those named in `only`) and `--config` to
    a click command; unset flags are not recorded, so they never hide an env or file
    value (`given_flags` has the ones given)."""

    def decorate(f: Any) -> Any:
        for names, kwargs in reversed(_options_args(model, only, config)):
            f = click.option(*names, **kwargs)(f)
        return f

    return decorate


def given_flags(ctx: click.Context, model: type[SettingsModel]) -> dict[str, Any]:
    """The flags of `model` given on this command line, by field name (and `config`)."""
    given: dict[Any, dict[str, Any]] = ctx.meta.get(_GIVEN, {})
    return dict(given.get(model, {}))


def settings_from(ctx: click.Context, model: type[M], env: Mapping[str, str]) -> M:
    """The settings of a click command that has `settings_options(model)`: the TOML
    file, then `env`, then the flags given; a bad value is a usage error (exit 2)
    naming the field."""
    try:
        return from_sources(model, given_flags(ctx, model), env)
    except ConfigError as exc:
        raise click.UsageError(f"config error: {exc}") from None


def version_option(prog: str) -> click.Option:
    """`--version`: prints `PROG, version X` and exits 0 (click's wording)."""

    def show(ctx: click.Context, _: click.Parameter, value: bool) -> None:
        if value and not ctx.resilient_parsing:
            click.echo(f"{prog}, version {__version__}")
            ctx.exit()

    return click.Option(
        ["--version"], is_flag=True, expose_value=False, is_eager=True, callback=show,
        help="Show the version and exit.",
    )  # fmt: skip


def command(model: type[SettingsModel]) -> click.Command:
    """The daemon's command: its flags, `-h`, `--version`, and nothing to run
    (`parse_with_click`)."""
    return click.Command(
        model.prog,
        params=[
            *(click.Option(n, **k) for n, k in _options_args(model, None, config=True)),
            version_option(model.prog),
        ],
        help=model.summary,
        epilog=model.epilog,
        context_settings={"help_option_names": list(HELP_OPTIONS), "max_content_width": 100},
    )


def parse_with_click(model: type[SettingsModel], args: Sequence[str]) -> dict[str, Any]:
    """A daemon's `args` parsed by click, by field name: `-h` prints the help and exits
    0; a flag that does not parse exits 2 with click's usage message."""
    cmd = command(model)
    try:
        with cmd.make_context(model.prog, list(args)) as ctx:
            return given_flags(ctx, model)
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(exc.exit_code) from None
