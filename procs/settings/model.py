"""A settings model as every gpufleet process declares it: a frozen msgspec Struct
(`SettingsModel`) whose fields carry their bounds and description in `msgspec.Meta` and
how they look outside the model in `Option`; `fields` reads that declaration, `build`
checks values from any source into the model, and `ConfigError` (the one error of a
bad setting) names the field. A `SettingsGroup` (NATS's settings, declared once for
every process) nests in a model as one field and looks flat outside it: `outer_fields`
gives its fields their outside names (`nats.url` is `nats_url`, `--nats-url`,
`GPUFLEET_NATS_URL`) and `nest` puts values given by those names back in the group.
Pure: no I/O."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import msgspec

ENV_PREFIX = "GPUFLEET_"


CONFIG_ENV = ENV_PREFIX + "CONFIG"


NESTED = "__"  # GPUFLEET_HEALTH__XID_HOLD_S sets health.xid_hold_s


class ConfigError(Exception):
    """A setting is wrong; `field` names it (`sharing[0].mode`, `labels.bad key`)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


class Option(msgspec.Struct, frozen=True):
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
    # The subcommand that has the flag, when the model's command does not (the docs
    # then show `COMMAND --flag`). On a group: the subcommand of all its flags.
    command: str | None = None
    # On a `SettingsGroup` field: what its fields' outside names start with (default:
    # the field's name and `_`, so `nats.url` is `nats_url`).
    prefix: str | None = None
    # On a field of a group: its outside name when it is not prefix + name (a name
    # deployments already use, e.g. `subject_prefix`).
    outer: str | None = None


class SettingsModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every process's settings: frozen, unknown keys rejected.

    `load` gathers file, env and flags and `build` checks them; a model built in code
    (tests, benchmarks) takes its values as given and never reads the environment.
    """

    prog: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    toml_table: ClassVar[str | None] = None  # the file's table, e.g. [coordinator]
    config_env: ClassVar[str] = CONFIG_ENV  # the variable that names the file
    epilog: ClassVar[str | None] = None  # said after the flags in `--help` (subcommands)

    @classmethod
    def environment_extras(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """Values from non-`GPUFLEET_*` variables (systemd's), below the `GPUFLEET_` ones."""
        return {}

    def check(self) -> None:
        """Rules across fields; raise ConfigError naming one of them."""


class SettingsGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Settings several models share, declared once and nested in each as one field
    (`nats: NatsSettings`). Outside the model its fields are flat: flags, env vars and
    the docs say `prefix + name`; a file may give them as a table (`[nats]`) or flat."""

    def check(self) -> None:
        """Rules across the group's fields; raise ConfigError naming one by its outside
        name (`nats_tls_key`)."""


class Field(msgspec.Struct, frozen=True):
    """One field of a settings model, as this module reads its declaration."""

    name: str  # a group's field: its outside name (`nats_url`)
    annotation: Any  # without Annotated's metadata
    description: str
    option: Option
    default: Any  # msgspec.NODEFAULT when required
    default_factory: Any  # msgspec.NODEFAULT when none
    # Where it lives in the model when that is not `name`: ("nats", "url").
    path: tuple[str, ...] = ()

    @property
    def where(self) -> tuple[str, ...]:
        return self.path or (self.name,)

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


def is_group(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, SettingsGroup)


def outer_fields(model: type[msgspec.Struct]) -> Iterator[Field]:
    """The fields of `model` as they look outside it: each group's fields in place of
    the group, named by their outside names."""
    for field in fields(model):
        kind = kind_of(field.annotation)
        if not is_group(kind):
            yield field
            continue
        prefix = field.option.prefix if field.option.prefix is not None else field.name + "_"
        for inner in fields(kind):
            option = inner.option
            if field.option.command is not None and option.command is None:
                option = msgspec.structs.replace(option, command=field.option.command)
            yield msgspec.structs.replace(
                inner,
                name=option.outer or prefix + inner.name,
                option=option,
                path=(field.name, inner.name),
            )


def nest(model: type[msgspec.Struct], values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with those given by a group field's outside name (`nats_url`) moved into
    the group's table (`nats.url`); one setting given both ways is refused."""
    out = dict(values)
    for field in outer_fields(model):
        if not field.path or field.name not in out:
            continue
        group, key = field.path
        table = out.get(group, {})
        if not isinstance(table, dict):
            raise ConfigError(group, f"must be a table, got {type(table).__name__}")
        if key in table:
            raise ConfigError(field.name, f"given twice: as {field.name} and as {group}.{key}")
        out[group] = {**table, key: out.pop(field.name)}
    return out


M = TypeVar("M", bound=SettingsModel)


def build(model: type[M], values: Mapping[str, Any]) -> M:
    """`values` (from any source, text or typed; a group's as a table) checked into the
    model, or ConfigError naming the first field that is wrong (a group's field by its
    outside name)."""
    given = {k: dict(v) if k in _groups(model) and isinstance(v, dict) else v
             for k, v in values.items()}  # fmt: skip
    declared = list(outer_fields(model))
    for field in declared:
        holder, key = _holder(given, field)
        if holder is None or key not in holder:
            continue
        if field.option.before is not None:
            holder[key] = field.option.before(holder[key])
        if kind_of(field.annotation) is bool and isinstance(holder[key], str):
            text = holder[key].strip().lower()
            holder[key] = _TRUE.get(text, holder[key])
        _check_table_items(field, holder[key])
    try:
        settings = msgspec.convert(given, model, strict=False, dec_hook=_from_text)
    except msgspec.ValidationError as exc:
        where, message = _where(str(exc))
        outside = {".".join(f.path): f.name for f in declared if f.path}
        raise ConfigError(outside.get(where, where), message) from None
    for field in declared:
        if field.option.check is not None:
            value: Any = settings
            for name in field.where:
                value = getattr(value, name)
            try:
                field.option.check(value)
            except ValueError as exc:
                raise ConfigError(field.name, str(exc)) from None
    for name in _groups(model):
        getattr(settings, name).check()
    settings.check()
    return settings


def _groups(model: type[msgspec.Struct]) -> list[str]:
    return [f.name for f in fields(model) if is_group(kind_of(f.annotation))]


def _holder(given: dict[str, Any], field: Field) -> tuple[dict[str, Any] | None, str]:
    """The table that holds `field`'s value in `given` (a group's, or `given`), and its key."""
    *groups, key = field.where
    holder: Any = given
    for group in groups:
        holder = holder.get(group)
        if not isinstance(holder, dict):
            return None, key
    return holder, key


# The spellings systemd and most tools take for a yes or no in an env var.
_TRUE = {
    **dict.fromkeys(("1", "true", "yes", "on", "y", "t"), True),
    **dict.fromkeys(("0", "false", "no", "off", "n", "f"), False),
}


def _check_table_items(field: Field, value: Any) -> None:
    """A table's keys and values one by one, so that the error names the key
    (`labels.bad key`), which msgspec's own path leaves out."""
    kind = kind_of(field.annotation)
    if get_origin(kind) is not dict or not isinstance(value, dict):
        return
    key_type, value_type = get_args(kind)
    for key, item in value.items():
        try:
            msgspec.convert(key, key_type, strict=False)
            msgspec.convert(item, value_type, strict=False, dec_hook=_from_text)
        except msgspec.ValidationError as exc:
            _, message = _where(str(exc))
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


def env_name(field: Field) -> str:
    """The variable that sets a top-level field (or a group's, by its outside name)."""
    return field.option.env or ENV_PREFIX + field.name.upper()


def flag_names(name: str, option: Option) -> list[str]:
    main = option.flag or "--" + name.replace("_", "-")
    old = ["--" + d.replace("_", "-") for d in option.deprecated]
    return [main, *option.aliases, *old]


def kind_of(annotation: Any) -> Any:
    """The annotation without `| None` and without Annotated's metadata."""
    if get_origin(annotation) is Annotated:
        return kind_of(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return kind_of(args[0])
    return annotation


def is_table(kind: Any) -> bool:
    """Whether `kind` is a model of its own (`[health]`): file and env only, no flag."""
    return isinstance(kind, type) and issubclass(kind, msgspec.Struct)


def is_complex(annotation: Any) -> bool:
    """Whether an env value for this type is JSON (tables, lists)."""
    if get_origin(annotation) is Annotated:
        return is_complex(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return any(is_complex(a) for a in get_args(annotation) if a is not type(None))
    kind = get_origin(annotation) or annotation
    if not isinstance(kind, type) or issubclass(kind, str | bytes):
        return False
    return issubclass(kind, msgspec.Struct | Mapping | Sequence | AbstractSet | tuple)


def join_items(field: Field, items: Sequence[str]) -> Any:
    """Items of a table (`K=V` each) merge into one; items of a list stay a list."""
    assert field.option.item is not None
    parsed = [field.option.item(s.strip()) for s in items]
    if get_origin(kind_of(field.annotation)) is dict:
        return {k: v for p in parsed for k, v in p.items()}
    return parsed


def choices_of(annotation: Any) -> list[str]:
    kind = kind_of(annotation)
    if get_origin(kind) is Literal:
        return [str(a) for a in get_args(kind)]
    return []
