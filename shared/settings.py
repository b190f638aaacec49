"""Settings from a model, the same way for every gpufleet process.

Each process declares one frozen `SettingsModel` (a msgspec Struct whose fields carry
their bounds and description in `msgspec.Meta`, and how they look outside the model in
`Option`); this module owns what every process does with it: the sources in precedence
(flags > `GPUFLEET_*` env > the TOML file named by `--config` or `GPUFLEET_CONFIG` >
defaults), the command line generated from the fields (name, type, help, choices),
errors that name the field (`ConfigError`, the one error of a bad setting), and the
markdown table the docs carry. The command line is click's, for the daemons as for
`gpufleet`: `settings_options` adds the flags to a command, `load` parses a daemon's.
Nothing here reads the process environment: `main` passes it in. The one I/O is
reading the config file the caller names.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import click
import msgspec

ENV_PREFIX = "GPUFLEET_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
NESTED = "__"  # GPUFLEET_HEALTH__XID_HOLD_S sets health.xid_hold_s

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "ConfigError",
    "Field",
    "FlagSpec",
    "Option",
    "SettingsModel",
    "build",
    "command",
    "config_help",
    "env_name",
    "fields",
    "flag_names",
    "flag_specs",
    "from_sources",
    "given_flags",
    "load",
    "markdown_table",
    "parse_flags",
    "settings_options",
    "with_table",
]


class ConfigError(Exception):
    """A setting is wrong; `field` names it (`sharing[0].mode`, `labels.bad key`)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class Option:
    """How a field looks outside the model: on the command line, in the env, in the docs,
    and the checks its type cannot say.

    Put it in the field's `Annotated[...]` metadata; fields without one get the defaults.
    """

    flag: str | None = None  # default: --field-name
    aliases: tuple[str, ...] = ()  # other spellings of the flag still accepted
    deprecated: tuple[str, ...] = ()  # old key names: file key, GPUFLEET_ name, --flag
    # The variable when it is not GPUFLEET_<FIELD> (a name deployments already use).
    env: str | None = None
    metavar: str | None = None
    # Text form of a list or table field: the flag repeats, one item each; the env var
    # holds items joined by `separator`. Items of a table merge key by key.
    item: Callable[[str], Any] | None = None
    separator: str = ","
    default_doc: str | None = None  # the default as the docs say it, when not a literal
    # Applied to the raw value from any source before the type is checked (`debug` →
    # `DEBUG`), and to the typed value after it (raise ValueError: the field is named).
    before: Callable[[Any], Any] | None = None
    check: Callable[[Any], object] | None = None


class SettingsModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every process's settings: frozen, unknown keys rejected.

    `load` gathers file, env and flags and `build` checks them; a model built in code
    (tests, benchmarks) takes its values as given and never reads the environment.
    """

    prog: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    toml_table: ClassVar[str | None] = None  # the file's table, e.g. [coordinator]
    config_env: ClassVar[str] = CONFIG_ENV  # the variable that names the file

    @classmethod
    def environment_extras(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """Values from non-`GPUFLEET_*` variables (systemd's), below the `GPUFLEET_` ones."""
        return {}

    def check(self) -> None:
        """Rules across fields; raise ConfigError naming one of them."""


@dataclass(frozen=True)
class Field:
    """One field of a settings model, as this module reads its declaration."""

    name: str
    annotation: Any  # without Annotated's metadata
    description: str
    option: Option
    default: Any  # msgspec.NODEFAULT when required
    default_factory: Any  # msgspec.NODEFAULT when none

    @property
    def required(self) -> bool:
        return self.default is msgspec.NODEFAULT and self.default_factory is msgspec.NODEFAULT

    def default_value(self) -> Any:
        if self.default_factory is not msgspec.NODEFAULT:
            return self.default_factory()
        return None if self.default is msgspec.NODEFAULT else self.default


def fields(model: type[msgspec.Struct]) -> Iterator[Field]:
    """The fields of `model` (a settings model or a table inside one), in order."""
    hints = typing.get_type_hints(model, include_extras=True)
    for info in msgspec.structs.fields(model):
        hint = hints[info.name]
        metadata: tuple[Any, ...] = ()
        if get_origin(hint) is Annotated:
            hint, *rest = get_args(hint)
            metadata = tuple(rest)
        description = next(
            (m.description for m in metadata if isinstance(m, msgspec.Meta) and m.description),
            "",
        )
        option = next((m for m in metadata if isinstance(m, Option)), Option())
        yield Field(info.name, hint, description, option, info.default, info.default_factory)


M = TypeVar("M", bound=SettingsModel)


def load(
    model: type[M],
    argv: Sequence[str] | None,
    env: Mapping[str, str],
    defaults: Mapping[str, Any] | None = None,
) -> M:
    """The settings for this process. Bad flags exit 2 and `-h` prints the help (click);
    bad values raise ConfigError naming the field. `defaults` sit below every source (a
    one-shot command may fill in what only the daemon needs)."""
    return from_sources(model, parse_flags(model, argv), env, defaults)


def from_sources(
    model: type[M],
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    defaults: Mapping[str, Any] | None = None,
) -> M:
    """The settings from flags already parsed (`parse_flags`, `given_flags`): `flags`
    holds the given ones by field name, and `config` for the file."""
    args = dict(flags)
    config = args.pop("config", None) or env.get(model.config_env) or None
    layers = [
        dict(defaults or {}),
        read_toml(Path(config), model) if config else {},
        from_env(model, env),
        from_flags(model, args),
    ]
    merged: dict[str, Any] = {}
    for layer in layers:
        merged = _merge(merged, layer)
    return build(model, merged)


def build(model: type[M], values: Mapping[str, Any]) -> M:
    """`values` (from any source, text or typed) checked into the model, or ConfigError
    naming the first field that is wrong."""
    given = dict(values)
    declared = list(fields(model))
    for field in declared:
        if field.option.before is not None and field.name in given:
            given[field.name] = field.option.before(given[field.name])
        if _kind(field.annotation) is bool and isinstance(given.get(field.name), str):
            text = given[field.name].strip().lower()
            given[field.name] = _TRUE.get(text, given[field.name])
        _check_table_items(field, given.get(field.name))
    try:
        settings = msgspec.convert(given, model, strict=False, dec_hook=_from_text)
    except msgspec.ValidationError as exc:
        raise ConfigError(*_where(str(exc))) from None
    for field in declared:
        if field.option.check is not None:
            try:
                field.option.check(getattr(settings, field.name))
            except ValueError as exc:
                raise ConfigError(field.name, str(exc)) from None
    settings.check()
    return settings


# The spellings systemd and most tools take for a yes or no in an env var.
_TRUE = {
    **dict.fromkeys(("1", "true", "yes", "on", "y", "t"), True),
    **dict.fromkeys(("0", "false", "no", "off", "n", "f"), False),
}


def _check_table_items(field: Field, value: Any) -> None:
    """A table's keys and values one by one, so that the error names the key
    (`labels.bad key`), which msgspec's own path leaves out."""
    kind = _kind(field.annotation)
    if get_origin(kind) is not dict or not isinstance(value, dict):
        return
    key_type, value_type = get_args(kind)
    for key, item in value.items():
        try:
            msgspec.convert(key, key_type, strict=False)
            msgspec.convert(item, value_type, strict=False, dec_hook=_from_text)
        except msgspec.ValidationError as exc:
            message, _ = _where(str(exc))
            raise ConfigError(f"{field.name}.{key}", message) from None


def _from_text(kind: type, value: Any) -> Any:
    """Types msgspec does not build itself, from their TOML, env or flag form."""
    if kind is Path:
        if isinstance(value, str | Path):
            return Path(value)
        raise TypeError(f"Expected a path, got `{type(value).__name__}`")
    raise NotImplementedError


_AT = re.compile(r"(?P<message>.*?)(?: - at (?:`key` in )?`\$(?P<path>[^`]*)`)?", re.DOTALL)
_NAMED = re.compile(r"Object (?:contains unknown|missing required) field `([^`]+)`")


def _where(text: str) -> tuple[str, str]:
    """(field, message) from msgspec's error text: `Expected … - at `$.sharing[0].mode``."""
    found = _AT.fullmatch(text)
    assert found is not None  # every text matches: the path part is optional
    message, path = found["message"], (found["path"] or "").replace("[...]", "")
    path = path.removeprefix(".")
    named = _NAMED.match(message)
    if named:
        path = f"{path}.{named[1]}" if path else named[1]
    return path or "settings", message


def read_toml(path: Path, model: type[SettingsModel]) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("config", f"{path} is not valid TOML: {exc}") from None
    if model.toml_table is not None and model.toml_table in data:
        data = data[model.toml_table]
        if not isinstance(data, dict):
            raise ConfigError("config", f"{path}: [{model.toml_table}] must be a table")
    data = {k.replace("-", "_"): v for k, v in data.items()}
    for field in fields(model):
        for old in field.option.deprecated:
            if old in data:
                data.setdefault(field.name, data.pop(old))
    return data


def from_env(model: type[SettingsModel], env: Mapping[str, str]) -> dict[str, Any]:
    """`GPUFLEET_<FIELD>` for each field, names case-insensitive, empty values ignored.

    Tables and lists (and nested tables) are JSON, or the `Option.item` text form where
    the field has one; `GPUFLEET_<TABLE>__<KEY>` sets one key of a table, merged over
    the JSON value. A value that cannot be parsed raises ConfigError naming the field.
    """
    given = {k.lower(): v for k, v in env.items() if v != ""}
    declared = list(fields(model))
    for field in declared:
        for old in field.option.deprecated:
            old_key = (ENV_PREFIX + old).lower()
            if old_key in given:
                given.setdefault((ENV_PREFIX + field.name).lower(), given.pop(old_key))
    values: dict[str, Any] = {}
    for field in declared:
        name = env_name(field)
        key = name.lower()
        text = given.get(key)
        try:
            value = _env_value(field, text)
            # The text form of a table stands alone.
            itemized = field.option.item is not None and text is not None
            nested = {} if itemized else _nested(field.annotation, key + NESTED.lower(), given)
        except ValueError as exc:
            raise ConfigError(field.name, f"{name}: {exc}") from None
        if nested:
            value = _merge(value, nested) if isinstance(value, dict) else nested
        if value is not None:
            values[field.name] = value
    return {**model.environment_extras(env), **values}


def env_name(field: Field) -> str:
    """The variable that sets a top-level field."""
    return field.option.env or ENV_PREFIX + field.name.upper()


def _env_value(field: Field, text: str | None) -> Any:
    if text is None:
        return None
    if field.option.item is not None:
        items = [s for s in text.split(field.option.separator) if s.strip()]
        return _join(field, items)
    return json.loads(text) if _is_complex(field.annotation) else text


def _nested(annotation: Any, prefix: str, given: Mapping[str, str]) -> dict[str, Any]:
    """`prefix` + `key[__key…]` variables as a table; values of complex fields are JSON."""
    kind = _kind(annotation)
    if not _is_table(kind) and get_origin(kind) is not dict and kind is not dict:
        return {}
    out: dict[str, Any] = {}
    for variable, text in given.items():
        if not variable.startswith(prefix):
            continue
        *keys, last = variable[len(prefix) :].split(NESTED.lower())
        table, target = out, kind
        for key in keys:
            target = _field_type(target, key)
            inner = table.setdefault(key, {})
            if not isinstance(inner, dict):
                break
            table = inner
        else:
            target = _field_type(target, last)
            table[last] = json.loads(text) if target is not None and _is_complex(target) else text
    return out


def _field_type(kind: Any, key: str) -> Any:
    """The annotation of `key` inside a table (None when it is not a table's field)."""
    kind = _kind(kind)
    if _is_table(kind):
        return next((f.annotation for f in fields(kind) if f.name == key), None)
    return None


def _is_table(kind: Any) -> bool:
    """Whether `kind` is a model of its own (`[health]`): file and env only, no flag."""
    return isinstance(kind, type) and issubclass(kind, msgspec.Struct)


def _is_complex(annotation: Any) -> bool:
    """Whether an env value for this type is JSON (tables, lists)."""
    if get_origin(annotation) is Annotated:
        return _is_complex(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_complex(a) for a in get_args(annotation) if a is not type(None))
    kind = get_origin(annotation) or annotation
    if not isinstance(kind, type) or issubclass(kind, str | bytes):
        return False
    return issubclass(kind, msgspec.Struct | Mapping | Sequence | AbstractSet | tuple)


def from_flags(model: type[SettingsModel], args: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in fields(model):
        if field.name not in args:
            continue
        value = args[field.name]
        if field.option.item is not None:
            try:
                value = _join(field, value)
            except ValueError as exc:
                flag = flag_names(field.name, field.option)[0]
                raise ConfigError(field.name, f"{flag}: {exc}") from None
        out[field.name] = value
    return out


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
        kind = _kind(field.annotation)
        if _is_table(kind):
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
        elif choices := _choices(field.annotation):
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


def flag_names(name: str, option: Option) -> list[str]:
    main = option.flag or "--" + name.replace("_", "-")
    old = ["--" + d.replace("_", "-") for d in option.deprecated]
    return [main, *option.aliases, *old]


def markdown_table(model: type[SettingsModel]) -> str:
    """The settings table in the docs: key in the file, flag, env var, default, meaning."""
    rows = ["| setting (file) | flag | env | default | description |", "|---|---|---|---|---|"]
    for key, env_text, flags, default, text in _doc_rows(model, "", ENV_PREFIX):
        flag_text = ", ".join(f"`{f}`" for f in flags) or "—"
        rows.append(f"| `{key}` | {flag_text} | {env_text} | {default} | {text} |")
    return "\n".join(rows)


def with_table(text: str, begin: str, end: str, table: str) -> str:
    """`text` with the part between the `begin` and `end` markers replaced by `table`."""
    head, found, rest = text.partition(begin)
    if not found:
        raise ValueError(f"marker {begin!r} not found")
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def _doc_rows(
    model: type[msgspec.Struct], prefix: str, env_prefix: str
) -> Iterator[tuple[str, str, list[str], str, str]]:
    for field in fields(model):
        option = field.option
        kind = _kind(field.annotation)
        variable = env_prefix + field.name.upper()
        if not prefix:
            variable = env_name(field)
        if _is_table(kind):
            yield from _doc_rows(kind, f"{prefix}{field.name}.", variable + NESTED)
            continue
        flags = [] if prefix else flag_names(field.name, option)
        if option.item is not None and flags:
            flags[0] += f" {option.metavar or 'VALUE'} (repeat)"
        text = field.description.replace("|", "\\|")
        if option.deprecated:
            text += f"; the old name `{'`, `'.join(option.deprecated)}` is still accepted"
        env_text = f"`{variable}`"
        if option.item is not None:
            metavar = option.metavar or "VALUE"
            env_text = f"`{variable}={metavar}{option.separator}…`"
        yield prefix + field.name, env_text, flags, _default_doc(field), text


def _default_doc(field: Field) -> str:
    if field.option.default_doc is not None:
        return field.option.default_doc
    if field.required:
        return "required"
    default = field.default_value()
    if default is None or default == () or default == {}:
        return "none"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"


def _join(field: Field, items: Sequence[str]) -> Any:
    """Items of a table (`K=V` each) merge into one; items of a list stay a list."""
    assert field.option.item is not None
    parsed = [field.option.item(s.strip()) for s in items]
    if get_origin(_kind(field.annotation)) is dict:
        return {k: v for p in parsed for k, v in p.items()}
    return parsed


def _kind(annotation: Any) -> Any:
    """The annotation without `| None` and without Annotated's metadata."""
    if get_origin(annotation) is Annotated:
        return _kind(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _kind(args[0])
    return annotation


def _choices(annotation: Any) -> list[str]:
    kind = _kind(annotation)
    if get_origin(kind) is Literal:
        return [str(a) for a in get_args(kind)]
    return []


def _metavar(kind: Any) -> str:
    if kind is int:
        return "INT"
    if kind is float:
        return "NUMBER"
    if kind is Path:
        return "PATH"
    return "TEXT"


def _merge(low: dict[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    """`high` over `low`; tables (labels, [health]) merge key by key."""
    out = dict(low)
    for key, value in high.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
