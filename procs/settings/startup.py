"""A daemon's settings at start: `parse_flags` reads its argv without click when every
argument is a plain, valid flag (`plain_flags`; the daemon's steady memory: click is
about 1 MB of it, bench/agent_bench.py); anything else — `-h`, an unknown flag, a bad
choice, a missing value — is handed to click (`procs.settings.commands`), which parses
it, or prints its help or usage message and exits: the answer is click's either way
(tests/unit/procs/test_flags.py). `load` puts the flags over env and file. Above
`flags`, `sources` and `commands`, so none of them imports another in a circle."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from procs.settings.flags import plain_flags
from procs.settings.model import M, SettingsModel
from procs.settings.sources import from_sources


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


def parse_flags(model: type[SettingsModel], argv: Sequence[str] | None) -> dict[str, Any]:
    """The flags given in `argv` (default: the process's), by field name. `-h` prints the
    help and exits 0; a flag that does not parse exits 2 with click's usage message."""
    args = list(sys.argv[1:] if argv is None else argv)
    given = plain_flags(model, args)
    if given is not None:
        return given
    # Help, or something only click may judge and word. Only then is click loaded.
    from procs.settings.commands import parse_with_click

    return parse_with_click(model, args)
