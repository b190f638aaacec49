"""A settings model's command line, click's for the daemons as for `gpufleet`: one
flag per field (name, type, help, choices) and `--config`; `settings_options` adds them
to a command and `given_flags` reads the ones given, `parse_flags` parses a daemon's
own argv. Unset flags are never recorded, so they never hide an env or file value."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click

from procs.settings.model import (
    SettingsModel,
    choices_of,
    env_name,
    fields,
    flag_names,
    is_table,
    kind_of,
)


@dataclass(frozen=True)
class FlagSpec:
    """The command-line flag of one field: `switch` is --x/--no-x, `repeat` takes one item
    each time."""

    dest: str
    names: tuple[str, ...]
    help: str
    style: Literal["switch", "choice", "repeat", "value"]
    choices: tuple[str, ...] = ()
    metavar: str | None = None

    def pick(self, text: str) -> str:
        """A choice matched case-insensitively (`--log-level debug`)."""
        return next((c for c in self.choices if c.lower() == text.lower()), text)


def flag_specs(model: type[SettingsModel]) -> Iterator[FlagSpec]:
    """One flag per field; nested tables are file and env only."""
    for field in fields(model):
        kind = kind_of(field.annotation)
        if is_table(kind):
            continue
        option = field.option
        names = tuple(flag_names(field.name, option))
        help_text = field.description + f" (env {env_name(field)})"
        if option.item is not None:
            yield FlagSpec(
                field.name, names, help_text, "repeat", metavar=option.metavar or "VALUE"
            )
        elif kind is bool:
            yield FlagSpec(field.name, names, help_text, "switch")
        elif choices := choices_of(field.annotation):
            yield FlagSpec(field.name, names, help_text, "choice", tuple(choices))
        else:
            metavar = option.metavar or _metavar(kind)
            yield FlagSpec(field.name, names, help_text, "value", metavar=metavar)


def config_help(model: type[SettingsModel]) -> str:
    table = f" ([{model.toml_table}] table or top level)" if model.toml_table else ""
    return f"TOML settings file{table}; env {model.config_env}"


# click's ctx.meta (shared by a command and its subcommands): the settings flags given, by
# model, then by field name; `gpufleet --config A alerts forward --config B` reads A for
# the CLI's settings and B for the forwarder's.
_GIVEN = "gpufleet.settings-flags"


HELP_OPTIONS = ("-h", "--help")


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


def command(model: type[SettingsModel]) -> click.Command:
    """The daemon's command: its flags, `-h`, and nothing to run (`parse_flags`)."""
    return click.Command(
        model.prog,
        params=[click.Option(n, **k) for n, k in _options_args(model, None, config=True)],
        help=model.summary,
        context_settings={"help_option_names": list(HELP_OPTIONS), "max_content_width": 100},
    )


def parse_flags(model: type[SettingsModel], argv: Sequence[str] | None) -> dict[str, Any]:
    """The flags given in `argv` (default: the process's), by field name. `-h` prints the
    help and exits 0; a flag that does not parse exits 2 with click's usage message."""
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = command(model)
    try:
        with cmd.make_context(model.prog, args) as ctx:
            return given_flags(ctx, model)
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(exc.exit_code) from None


def _metavar(kind: Any) -> str:
    if kind is int:
        return "INT"
    if kind is float:
        return "NUMBER"
    if kind is Path:
        return "PATH"
    return "TEXT"
