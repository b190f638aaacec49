"""The `gpufleet` command line's own settings: which coordinator, with which key, how long
to wait, and the NATS server `alerts watch` follows. The same mechanism as the daemons'
(`procs.settings`): the `[cli]` table (or top-level keys) of the TOML file named by
`--config` or `GPUFLEET_CLI_CONFIG`, then `GPUFLEET_*` env, then flags; the flags are
generated from the model (as click options, `procs.settings.commands.settings_options`) and so
is the table in docs/operator.md.

`python -m ops.cli.settings docs/operator.md` rewrites that table; a test fails when the
doc and the model disagree.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
from msgspec import Meta

from ops.kit.session import DEFAULT_URL
from procs.nats import NatsSettings
from procs.settings import DocTable, Option, SettingsModel, outer_fields

__all__ = ["CliSettings"]


WATCH = "alerts watch"  # the command that reads NATS, and has its flags


class CliSettings(SettingsModel, frozen=True):
    prog = "gpufleet"
    summary = "The operator and tenant command line."
    toml_table = "cli"
    # Not GPUFLEET_CONFIG: that names a daemon's file, which may sit in the same shell.
    config_env = "GPUFLEET_CLI_CONFIG"

    url: Annotated[str, Meta(description="coordinator URL")] = DEFAULT_URL
    key: Annotated[
        str | None, Meta(description="API key (`gpufleet new-key`, `gpufleet key-create`)")
    ] = None
    timeout_s: Annotated[
        float, Meta(gt=0, le=3600, description="seconds per call"), Option(flag="--timeout")
    ] = 30.0
    insecure_http: Annotated[
        bool,
        Meta(
            description="allow plain http:// to a coordinator off this machine (the key"
            " then crosses the network in clear)"
        ),
    ] = False
    # `alerts watch` only; its flags are on that command. The names are the daemons'.
    nats: Annotated[NatsSettings, Option(command=WATCH)] = msgspec.field(
        default_factory=NatsSettings
    )

    # Which flags go on the top-level command, and which on `alerts watch`.
    API_FLAGS: ClassVar[tuple[str, ...]] = ("url", "key", "timeout_s", "insecure_http")
    NATS_FLAGS: ClassVar[tuple[str, ...]] = ()  # the `nats` group's, set below


CliSettings.NATS_FLAGS = tuple(f.name for f in outer_fields(CliSettings) if f.path[:1] == ("nats",))


DOC_TABLE = DocTable(CliSettings, "cli-settings", "ops.cli.settings", "docs/operator.md")


if __name__ == "__main__":
    DOC_TABLE.main()
