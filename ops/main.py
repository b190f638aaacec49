"""`gpufleet`: the operator and tenant command line.

Read commands (`pools`, `nodes`, `node`, `gpus`, `reservations`, `reservation`,
`tenants`, `keys`, `usage`, `summary`, `watch`, `alerts watch`) print tables on a
terminal and JSON when piped (`-o table|wide|json|csv`); pools go by name (`-o wide`
adds their ids). The daily verbs `reserve`, `extend`, `release` and `maintenance`
(`--dry-run` first) answer in one line. Every API method is also a command under
`gpufleet api`, its flags made from the method's input; `gpufleet call METHOD JSON`
sends a raw body. A tenant key acts for its own tenant without naming it. Errors are
one line naming the URL, the code and the failing field; exit 1 (API or connection),
2 (usage).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import click

from ops.cli.commands import ALERT_COMMANDS, COMMANDS
from ops.cli.settings import CliSettings
from ops.demo.command import demo_cmd
from ops.forwarder.command import forward_cmd
from ops.kit.errors import OpsError
from ops.kit.options import output_options
from ops.kit.server_text import shown
from ops.kit.session import Session
from ops.natsauth.command import nats_auth_cmd
from ops.slurm.command import slurm_group
from procs.settings.commands import settings_from, settings_options
from procs.version import __version__

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT, help=__doc__)
@settings_options(CliSettings, only=CliSettings.API_FLAGS)
@click.version_option(__version__, "--version", prog_name="gpufleet")
@output_options
@click.pass_context
def cli(ctx: click.Context) -> None:
    session = ctx.ensure_object(Session)
    settings = settings_from(ctx, CliSettings, session.env)
    session.url, session.key, session.timeout_s = settings.url, settings.key, settings.timeout_s
    session.insecure_http = settings.insecure_http


@cli.group("alerts")
def alerts_group() -> None:
    """Alerts the coordinator publishes on NATS (kept in a JetStream stream)."""


for _command in (*COMMANDS, demo_cmd, nats_auth_cmd, slurm_group):
    cli.add_command(_command)
for _command in (*ALERT_COMMANDS, forward_cmd):
    alerts_group.add_command(_command)


# --- entry point ----------------------------------------------------------------------


def _fail(text: str, code: int, prog: str = "gpufleet") -> int:
    # Errors quote what a server said: shown inert (`ops.kit.server_text`).
    sys.stderr.write(f"{prog}: {shown(text)}\n")
    sys.stderr.flush()
    return code


def run(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> int:
    """The command line; `env`'s `GPUFLEET_*` settings (when given) sit below flags and
    the process environment."""
    session = Session(env={**(env or {}), **os.environ})
    try:
        try:
            cli.main(
                args=list(argv or []), prog_name="gpufleet", standalone_mode=False, obj=session
            )
            sys.stdout.flush()
        except click.exceptions.Exit as exc:
            return int(exc.exit_code)
        except SystemExit as exc:  # a subcommand's own exit status (demo)
            return exc.code if isinstance(exc.code, int) else 1
        except click.exceptions.Abort:
            return _fail("interrupted", 130)
        except click.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # click 8.2+: `gpufleet` alone
                sys.stderr.write(exc.format_message() + "\n")  # the help, as click shows it
                return 2
            hint = f" (see {exc.ctx.command_path} -h)" if exc.ctx is not None else ""
            return _fail(f"{exc.format_message()}{hint}", 2)
        except click.ClickException as exc:
            return _fail(exc.format_message(), exc.exit_code)
        except OpsError as exc:  # every tool's own failures: here and nowhere else
            return _fail(exc.one_line(), exc.exit_code, exc.prog)
        except KeyboardInterrupt:
            return _fail("interrupted", 130)
    except BrokenPipeError:
        # The reader went away (`gpufleet summary | head`): stop quietly, as cat would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return 0


def main() -> int:
    return run(sys.argv[1:], os.environ)


if __name__ == "__main__":
    sys.exit(main())
