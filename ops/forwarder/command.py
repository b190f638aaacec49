"""The forwarder's command line, `gpufleet alerts forward` and `gpufleet-alerts forward`:
its flags generated from `ForwarderSettings`, a bad setting a usage error (exit 2)
naming the field. Light to import: the forwarder itself is loaded only to run."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import click

from ops.forwarder.settings import ForwarderSettings
from ops.kit.redact import redact
from procs.settings.commands import settings_from, settings_options
from procs.version import __version__

__all__ = ["alerts_cli", "forward_cmd", "main"]

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command("forward", context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="gpufleet-alerts")
@settings_options(ForwarderSettings)
@click.pass_context
def forward_cmd(ctx: click.Context) -> None:
    """Deliver the alert stream to Alertmanager and/or webhooks (also `gpufleet-alerts
    forward`; settings from the `[alerts]` table of the --config file, then env, then
    flags)."""
    try:
        settings = settings_from(ctx, ForwarderSettings, os.environ)
    except click.UsageError as exc:
        # A URL in a bad value may carry a password.
        raise click.UsageError(redact(exc.message), ctx) from None
    from ops.forwarder.daemon import serve

    code = serve(settings, os.environ)
    if code:
        raise SystemExit(code)


@click.group("gpufleet-alerts", context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="gpufleet-alerts")
def alerts_cli() -> None:
    """The gpufleet alert forwarder (the same as `gpufleet alerts forward`)."""


alerts_cli.add_command(forward_cmd)


def main(argv: Sequence[str] | None = None) -> int:
    """`gpufleet-alerts`; click exits with the command's status."""
    alerts_cli.main(argv, prog_name="gpufleet-alerts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
