"""`gpufleet demo`: its flags; the demo itself (`ops.demo.run`) is loaded only to run."""

from __future__ import annotations

import click


@click.command("demo")
@click.option("--state-dir", help="keep the SQLite ledger and logs here")
@click.option("--port", type=int, default=0, help="API port (default: a free one)")
@click.option("--interval", type=float, default=2.0, show_default=True,
              help="agent heartbeat seconds")  # fmt: skip
@click.option("--agents", type=click.IntRange(1, 4), default=4, show_default=True)
@click.option("--duration", type=float, help="stop after this many seconds")
def demo_cmd(
    state_dir: str | None, port: int, interval: float, agents: int, duration: float | None
) -> None:
    """Run nats-server, a coordinator and simulated agents on this machine."""
    from ops.demo.run import DemoSettings, run_demo

    code = run_demo(DemoSettings(state_dir, port, interval, duration, agents))
    if code:
        raise SystemExit(code)
