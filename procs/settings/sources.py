"""Where settings come from, in precedence: flags > `GPUFLEET_*` env > the TOML file
named by `--config` (or the model's config variable) > defaults. Nothing here reads
the process environment or its argv: `load` (`procs.settings.startup`) passes them
in. The one I/O is reading the config file the caller names. A group's fields
(`nats.url`) are read by their outside names (`--nats-url`, `GPUFLEET_NATS_URL`,
`nats_url = …`) and, in the file, as the group's table too (`[nats]`, `url = …`);
`nest` puts them in the group."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_origin

from procs.settings.model import (
    ENV_PREFIX,
    NESTED,
    ConfigError,
    Field,
    M,
    SettingsModel,
    build,
    env_name,
    fields,
    flag_names,
    is_complex,
    is_table,
    join_items,
    kind_of,
    nest,
    outer_fields,
)


def from_sources(
    model: type[M],
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    defaults: Mapping[str, Any] | None = None,
) -> M:
    """The settings from flags already parsed (`parse_flags`, or click's
    `commands.given_flags`): `flags` holds the given ones by field name, and `config`
    for the file."""
    args = dict(flags)
    config = args.pop("config", None) or env.get(model.config_env) or None
    layers = [
        nest(model, defaults or {}),
        read_toml(Path(config), model) if config else {},
        nest(model, from_env(model, env)),
        nest(model, from_flags(model, args)),
    ]
    merged: dict[str, Any] = {}
    for layer in layers:
        merged = _merge(merged, layer)
    return build(model, merged)


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
    for field in outer_fields(model):
        for old in field.option.deprecated:
            if old in data:
                data.setdefault(field.name, data.pop(old))
    try:
        return nest(model, data)
    except ConfigError as exc:
        raise ConfigError(exc.field, f"{path}: {exc.message}") from None


def from_env(model: type[SettingsModel], env: Mapping[str, str]) -> dict[str, Any]:
    """`GPUFLEET_<FIELD>` for each field, names case-insensitive, empty values ignored.

    Tables and lists (and nested tables) are JSON, or the `Option.item` text form where
    the field has one; `GPUFLEET_<TABLE>__<KEY>` sets one key of a table, merged over
    the JSON value. A value that cannot be parsed raises ConfigError naming the field.
    """
    given = {k.lower(): v for k, v in env.items() if v != ""}
    declared = list(outer_fields(model))
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


def _env_value(field: Field, text: str | None) -> Any:
    if text is None:
        return None
    if field.option.item is not None:
        items = [s for s in text.split(field.option.separator) if s.strip()]
        return join_items(field, items)
    return json.loads(text) if is_complex(field.annotation) else text


def _nested(annotation: Any, prefix: str, given: Mapping[str, str]) -> dict[str, Any]:
    """`prefix` + `key[__key…]` variables as a table; values of complex fields are JSON."""
    kind = kind_of(annotation)
    if not is_table(kind) and get_origin(kind) is not dict and kind is not dict:
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
            table[last] = json.loads(text) if target is not None and is_complex(target) else text
    return out


def _field_type(kind: Any, key: str) -> Any:
    """The annotation of `key` inside a table (None when it is not a table's field)."""
    kind = kind_of(kind)
    if is_table(kind):
        return next((f.annotation for f in fields(kind) if f.name == key), None)
    return None


def from_flags(model: type[SettingsModel], args: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in outer_fields(model):
        if field.name not in args:
            continue
        value = args[field.name]
        if field.option.item is not None:
            try:
                value = join_items(field, value)
            except ValueError as exc:
                flag = flag_names(field.name, field.option)[0]
                raise ConfigError(field.name, f"{flag}: {exc}") from None
        out[field.name] = value
    return out


def _merge(low: dict[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    """`high` over `low`; tables (labels, [health]) merge key by key."""
    out = dict(low)
    for key, value in high.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
