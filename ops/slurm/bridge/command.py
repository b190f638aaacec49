"""The bridge's command line, `gpufleet-slurm-bridge`: its flags generated from
`BridgeSettings`, a bad setting a usage error (exit 2) naming the field. Light to
import: the daemon is loaded only to run."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import click

from ops.slurm.bridge.settings import BridgeSettings
from procs.settings.commands import settings_from, settings_options
from procs.version import __version__

__all__ = ["bridge_cmd", "main"]

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command("gpufleet-slurm-bridge", context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="gpufleet-slurm-bridge")
@settings_options(BridgeSettings)
@click.pass_context
def bridge_cmd(ctx: click.Context) -> None:
    """Keep Slurm's reservations (`gpufleet-<reservationId>`) and drains (reason
    `gpufleet: …`) in step with the ledger; settings from the `[slurm_bridge]` table of
    the --config file, then env, then flags. Nothing else in Slurm is touched."""
    settings = settings_from(ctx, BridgeSettings, os.environ)
    from ops.slurm.bridge.daemon import serve

    code = serve(settings, os.environ)
    if code:
        raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """`gpufleet-slurm-bridge`; click exits with the command's status."""
    bridge_cmd.main(argv, prog_name="gpufleet-slurm-bridge")
    return 0


if __name__ == "__main__":
    sys.exit(main())
