"""A settings model's command line: one flag per field (name, type, help, choices) and
`--config`, described once as `FlagSpec`s, and `plain_flags`, which reads a daemon's own
argv without click when every argument is a plain, valid flag (`procs.settings.startup`
hands anything else to click). Unset flags are never recorded, so they never hide an
env or file value."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from procs.settings.model import (
    SettingsModel,
    choices_of,
    env_name,
    flag_names,
    is_table,
    kind_of,
    outer_fields,
)


class FlagSpec(msgspec.Struct, frozen=True):
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
    """One flag per field (a group's by their outside names: `--nats-url`); nested
    tables are file and env only."""
    for field in outer_fields(model):
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


HELP_OPTIONS = ("-h", "--help")
CONFIG_SPEC = FlagSpec("config", ("--config",), "", "value", metavar="PATH")


def plain_flags(model: type[SettingsModel], args: Sequence[str]) -> dict[str, Any] | None:
    """`args` read as click reads them where each is a known flag (`--x v`, `--x=v`, a
    switch, a choice in any case, a repeated item); None for anything else (help, an
    unknown or misspelt flag, a missing value, a value that looks like a flag, a choice
    not offered, `--`, a positional argument), which only click answers."""
    by_name: dict[str, tuple[FlagSpec, bool]] = {}
    for spec in (CONFIG_SPEC, *flag_specs(model)):
        for name in spec.names:
            by_name[name] = (spec, True)
        if spec.style == "switch":
            by_name["--no-" + spec.names[0].removeprefix("--")] = (spec, False)
    given: dict[str, Any] = {}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        name, eq, inline = arg.partition("=")
        if not name.startswith("--") or name not in by_name:
            return None
        spec, on = by_name[name]
        if spec.style == "switch":
            if eq:
                return None
            given[spec.dest] = on
            continue
        if eq:
            value = inline
        elif rest and not rest[0].startswith("-"):
            value = rest.pop(0)
        else:
            return None
        if spec.style == "choice":
            picked = next((c for c in spec.choices if c.casefold() == value.casefold()), None)
            if picked is None:
                return None
            value = picked
        if spec.style == "repeat":
            given[spec.dest] = (*given.get(spec.dest, ()), value)
        else:
            given[spec.dest] = value
    return given


def _metavar(kind: Any) -> str:
    if kind is int:
        return "INT"
    if kind is float:
        return "NUMBER"
    if kind is Path:
        return "PATH"
    return "TEXT"
