"""Settings from a model, the same way for every gpufleet process, split by concern:
`model` (the declaration, `build`, `ConfigError`), `sources` (file, env and flags in
precedence), `flags` (the click command line) and `docs` (the docs' settings table).
The names every process uses are here."""

from __future__ import annotations

from procs.settings.docs import DocTable, markdown_table, with_table
from procs.settings.flags import (
    FlagSpec,
    command,
    config_help,
    flag_specs,
    given_flags,
    parse_flags,
    settings_options,
)
from procs.settings.model import (
    CONFIG_ENV,
    ENV_PREFIX,
    ConfigError,
    Field,
    Option,
    SettingsModel,
    build,
    env_name,
    fields,
    flag_names,
)
from procs.settings.sources import from_sources, load, settings_from

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "ConfigError",
    "DocTable",
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
    "settings_from",
    "settings_options",
    "with_table",
]
