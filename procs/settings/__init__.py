"""Settings from a model, the same way for every gpufleet process, split by concern:
`model` (the declaration, `build`, `ConfigError`), `sources` (file, env and flags in
precedence), `flags` (the command line, parsed without click where it can be),
`startup` (a daemon's `load`: its argv, without click or else with it),
`commands` (the flags as click options: `settings_options`, `settings_from`, a daemon's
`command`) and `docs` (the docs' settings table). The names every process uses are
here, none of them click's: a daemon that starts normally never loads click."""

from __future__ import annotations

from procs.settings.docs import DocTable, markdown_table, with_table
from procs.settings.flags import FlagSpec, config_help, flag_specs
from procs.settings.model import (
    CONFIG_ENV,
    ENV_PREFIX,
    ConfigError,
    Field,
    Option,
    SettingsGroup,
    SettingsModel,
    build,
    env_name,
    fields,
    flag_names,
    nest,
    outer_fields,
)
from procs.settings.sources import from_sources
from procs.settings.startup import load, parse_flags

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "ConfigError",
    "DocTable",
    "Field",
    "FlagSpec",
    "Option",
    "SettingsGroup",
    "SettingsModel",
    "build",
    "config_help",
    "env_name",
    "fields",
    "flag_names",
    "flag_specs",
    "from_sources",
    "load",
    "markdown_table",
    "nest",
    "outer_fields",
    "parse_flags",
    "with_table",
]
