"""Settings from a model, the same way on agent and coordinator.

Each daemon declares one frozen `SettingsModel` (a plain pydantic model); this module owns
what both do with it: the sources in precedence (flags > `GPUFLEET_*` env > the TOML
file named by `--config` or `GPUFLEET_CONFIG` > defaults), the command line generated
from the fields (name, type, help, choices), errors that name the field, and the
markdown table the docs carry. Nothing here reads the process environment: `main`
passes it in. The one I/O is reading the config file the caller names.
"""

from __future__ import annotations

import argparse
import json
import tomllib
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

ENV_PREFIX = "GPUFLEET_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
NESTED = "__"  # GPUFLEET_HEALTH__XID_HOLD_S sets health.xid_hold_s


class ConfigError(Exception):
    """A setting is wrong; `field` names it (`sharing[0].mode`, `labels.bad key`)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class Option:
    """How a field looks outside the model: on the command line, in the env, in the docs.

    Put it in the field's `Annotated[...]` metadata; fields without one get the defaults.
    """

    flag: str | None = None  # default: --field-name
    aliases: tuple[str, ...] = ()  # other spellings of the flag still accepted
    deprecated: tuple[str, ...] = ()  # old key names: file key, GPUFLEET_ name, --flag
    metavar: str | None = None
    # Text form of a list or table field: the flag repeats, one item each; the env var
    # holds items joined by `separator`. Items of a table merge key by key.
    item: Callable[[str], Any] | None = None
    separator: str = ","
    default_doc: str | None = None  # the default as the docs say it, when not a literal


class SettingsModel(BaseModel):
    """Base of both daemons' settings: frozen, unknown keys rejected, defaults validated.

    A plain pydantic model: `load` gathers file, env and flags itself, so a model built
    in code (tests, benchmarks) never picks up the process environment. (Not
    pydantic-settings: its import costs the agent ~2.5 MB of its 40 MB budget, and only
    its env parsing was used; `from_env` below does that part.)
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    prog: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    toml_table: ClassVar[str | None] = None  # the file's table, e.g. [coordinator]

    @classmethod
    def environment_extras(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """Values from non-`GPUFLEET_*` variables (systemd's), below the `GPUFLEET_` ones."""
        return {}


M = TypeVar("M", bound=SettingsModel)


def load(
    model: type[M],
    argv: Sequence[str] | None,
    env: Mapping[str, str],
    defaults: Mapping[str, Any] | None = None,
) -> M:
    """The settings for this process. Bad flags exit 2 (argparse); bad values raise
    ConfigError naming the field. `defaults` sit below every source (a one-shot command
    may fill in what only the daemon needs)."""
    args = vars(build_parser(model).parse_args(argv))
    config = args.pop("config", None) or env.get(CONFIG_ENV) or None
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
    try:
        return model(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(_where(first["loc"]), first["msg"]) from None


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
    for name, _, option in _fields(model):
        for old in option.deprecated:
            if old in data:
                data.setdefault(name, data.pop(old))
    return data


def from_env(model: type[SettingsModel], env: Mapping[str, str]) -> dict[str, Any]:
    """`GPUFLEET_<FIELD>` for each field, names case-insensitive, empty values ignored.

    Tables and lists (and nested models) are JSON, or the `Option.item` text form where
    the field has one; `GPUFLEET_<TABLE>__<KEY>` sets one key of a table, merged over
    the JSON value. A value that cannot be parsed raises ConfigError naming the field.
    """
    given = {k.lower(): v for k, v in env.items() if v != ""}
    for name, _, option in _fields(model):
        for old in option.deprecated:
            old_key = (ENV_PREFIX + old).lower()
            if old_key in given:
                given.setdefault((ENV_PREFIX + name).lower(), given.pop(old_key))
    values: dict[str, Any] = {}
    for name, field, option in _fields(model):
        key = (ENV_PREFIX + name).lower()
        text = given.get(key)
        try:
            value = _env_value(field, option, text)
            # The text form of a table stands alone (as it did under pydantic-settings).
            itemized = option.item is not None and text is not None
            nested = {} if itemized else _nested(field.annotation, key + NESTED.lower(), given)
        except ValueError as exc:
            raise ConfigError(name, f"{ENV_PREFIX}{name.upper()}: {exc}") from None
        if nested:
            value = _merge(value, nested) if isinstance(value, dict) else nested
        if value is not None:
            values[name] = value
    return {**model.environment_extras(env), **values}


def _env_value(field: FieldInfo, option: Option, text: str | None) -> Any:
    if text is None:
        return None
    if option.item is not None:
        return _join(field, option, [s for s in text.split(option.separator) if s.strip()])
    return json.loads(text) if _is_complex(field.annotation) else text


def _nested(annotation: Any, prefix: str, given: Mapping[str, str]) -> dict[str, Any]:
    """`prefix` + `key[__key…]` variables as a table; values of complex fields are JSON."""
    kind = _kind(annotation)
    is_model = isinstance(kind, type) and issubclass(kind, BaseModel)
    if not is_model and get_origin(kind) is not dict and kind is not dict:
        return {}
    out: dict[str, Any] = {}
    for env_name, text in given.items():
        if not env_name.startswith(prefix):
            continue
        *keys, last = env_name[len(prefix) :].split(NESTED.lower())
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
    """The annotation of `key` inside a model (None when it is not a model's field)."""
    kind = _kind(kind)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        field = kind.model_fields.get(key)
        return None if field is None else field.annotation
    return None


def _is_complex(annotation: Any) -> bool:
    """Whether an env value for this type is JSON (models, tables, lists), as
    pydantic-settings decided it."""
    if get_origin(annotation) is Annotated:
        return _is_complex(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_complex(a) for a in get_args(annotation) if a is not type(None))
    kind = get_origin(annotation) or annotation
    if not isinstance(kind, type) or issubclass(kind, str | bytes):
        return False
    return issubclass(kind, BaseModel | Mapping | Sequence | AbstractSet | tuple)


def from_flags(model: type[SettingsModel], args: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field, option in _fields(model):
        if name not in args:
            continue
        value = args[name]
        if option.item is not None:
            try:
                value = _join(field, option, value)
            except ValueError as exc:
                raise ConfigError(name, f"{flag_names(name, option)[0]}: {exc}") from None
        out[name] = value
    return out


def build_parser(model: type[SettingsModel]) -> argparse.ArgumentParser:
    """One flag per field (nested tables are file and env only); unset flags are absent
    from the namespace, so they never hide an env or file value."""
    parser = argparse.ArgumentParser(
        prog=model.prog, description=model.summary, argument_default=argparse.SUPPRESS
    )
    table = f" ([{model.toml_table}] table or top level)" if model.toml_table else ""
    parser.add_argument(
        "--config", metavar="PATH", help=f"TOML settings file{table}; env {CONFIG_ENV}"
    )
    for name, field, option in _fields(model):
        kind = _kind(field.annotation)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            continue
        help_text = (field.description or "") + f" (env {ENV_PREFIX}{name.upper()})"
        kwargs: dict[str, Any] = {"dest": name, "help": help_text}
        if option.item is not None:
            kwargs |= {"action": "append", "metavar": option.metavar or "VALUE"}
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            choices = _choices(field.annotation)
            if choices:
                kwargs |= {"choices": choices, "type": _pick_from(choices)}
            else:
                kwargs["metavar"] = option.metavar or _metavar(kind)
        parser.add_argument(*flag_names(name, option), **kwargs)
    return parser


def flag_names(name: str, option: Option) -> list[str]:
    main = option.flag or "--" + name.replace("_", "-")
    old = ["--" + d.replace("_", "-") for d in option.deprecated]
    return [main, *option.aliases, *old]


def markdown_table(model: type[SettingsModel]) -> str:
    """The settings table in the docs: key in the file, flag, env var, default, meaning."""
    rows = ["| setting (file) | flag | env | default | description |", "|---|---|---|---|---|"]
    for key, env_name, flags, default, text in _doc_rows(model, model, "", ENV_PREFIX):
        flag_text = ", ".join(f"`{f}`" for f in flags) or "—"
        rows.append(f"| `{key}` | {flag_text} | {env_name} | {default} | {text} |")
    return "\n".join(rows)


def with_table(text: str, begin: str, end: str, table: str) -> str:
    """`text` with the part between the `begin` and `end` markers replaced by `table`."""
    head, found, rest = text.partition(begin)
    if not found:
        raise ValueError(f"marker {begin!r} not found")
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def _doc_rows(
    root: type[SettingsModel], model: type[BaseModel], prefix: str, env_prefix: str
) -> Iterator[tuple[str, str, list[str], str, str]]:
    for name, field in model.model_fields.items():
        option = option_of(field)
        kind = _kind(field.annotation)
        env_name = env_prefix + name.upper()
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from _doc_rows(root, kind, f"{prefix}{name}.", env_name + NESTED)
            continue
        flags = [] if prefix else flag_names(name, option)
        if option.item is not None and flags:
            flags[0] += f" {option.metavar or 'VALUE'} (repeat)"
        text = (field.description or "").replace("|", "\\|")
        if option.deprecated:
            text += f"; the old name `{'`, `'.join(option.deprecated)}` is still accepted"
        env_text = f"`{env_name}`"
        if option.item is not None:
            metavar = option.metavar or "VALUE"
            env_text = f"`{env_name}={metavar}{option.separator}…`"
        yield prefix + name, env_text, flags, _default_doc(field, option), text


def _default_doc(field: FieldInfo, option: Option) -> str:
    if option.default_doc is not None:
        return option.default_doc
    if field.is_required():
        return "required"
    default = field.get_default(call_default_factory=True, validated_data={})
    if default is None or default == () or default == {}:
        return "none"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"


def _fields(model: type[SettingsModel]) -> Iterator[tuple[str, FieldInfo, Option]]:
    for name, field in model.model_fields.items():
        yield name, field, option_of(field)


def option_of(field: FieldInfo) -> Option:
    return next((m for m in field.metadata if isinstance(m, Option)), Option())


def _join(field: FieldInfo, option: Option, items: Sequence[str]) -> Any:
    """Items of a table (`K=V` each) merge into one; items of a list stay a list."""
    assert option.item is not None
    parsed = [option.item(s.strip()) for s in items]
    if get_origin(_kind(field.annotation)) is dict:
        return {k: v for p in parsed for k, v in p.items()}
    return parsed


def _kind(annotation: Any) -> Any:
    """The annotation without `| None`."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _choices(annotation: Any) -> list[str]:
    kind = _kind(annotation)
    if get_origin(kind) is Literal:
        return [str(a) for a in get_args(kind)]
    return []


def _pick_from(choices: list[str]) -> Callable[[str], str]:
    """Choices match case-insensitively (`--log-level debug`)."""

    def pick(text: str) -> str:
        return next((c for c in choices if c.lower() == text.lower()), text)

    return pick


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


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            continue
        else:
            out += ("." if out else "") + part
    return out or "settings"
