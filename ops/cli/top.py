"""`gpufleet watch`: a `top` for a pool (or every pool the key sees): the GPU buckets and
each node's state, redrawn every few seconds on a terminal; piped, one frame per
interval (JSON, or a table with `-o table`)."""

from __future__ import annotations

import time
from typing import Any

from ops.cli import fleet_views, views
from ops.kit.output import Column, Printer, Section, View, format_time, with_times
from ops.kit.session import Session
from shared.counts import COUNT_COLUMNS


def frame(session: Session, tenant: str | None, pool: str | None) -> View:
    data = session.capacity(tenant)
    chosen = [p for p in data["pools"] if pool in (None, p["poolId"], p["name"])]
    pool_id = chosen[0]["poolId"] if pool and chosen else pool
    summary_rows = []
    for p in chosen:
        gpu = views.pool_row(p, "gpu")
        summary_rows.append({"pool": p["name"]} | {c: gpu.get(c, 0) for c in COUNT_COLUMNS})
    nodes = fleet_views.nodes(session, tenant, pool_id)
    columns = [Column("pool", "POOL")] + [
        Column(c, views.SHORT_HEADERS.get(c, c.upper()), right=True) for c in COUNT_COLUMNS
    ]
    stamp = format_time(int(time.time() * 1000), session.local)
    return View(
        {"at": stamp, "pools": summary_rows, "nodes": nodes.data},
        [Section(columns, summary_rows, title="GPUs:"), *nodes.sections],
        [f"gpufleet watch  {stamp}  (Ctrl-C to stop)"],
    )


def run(session: Session, tenant: str | None, pool: str | None, interval_s: float,
        count: int | None) -> None:  # fmt: skip
    printer = session.printer
    if not printer.terminal:
        _frames(session, printer, tenant, pool, interval_s, count)
        return
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console()
    shown = 0
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while count is None or shown < count:
            text = _render(session, frame(session, tenant, pool))
            live.update(Text.from_ansi(text), refresh=True)
            shown += 1
            if count is not None and shown >= count:
                break
            time.sleep(interval_s)


def _render(session: Session, view: View) -> str:
    import io

    out = io.StringIO()
    Printer("wide" if session.format == "wide" else "table", session.local, out, True).show(view)
    return out.getvalue()


def _frames(session: Session, printer: Printer, tenant: str | None, pool: str | None,
            interval_s: float, count: int | None) -> None:  # fmt: skip
    shown = 0
    while count is None or shown < count:
        view: View = frame(session, tenant, pool)
        if printer.fmt == "json":
            import json

            data: Any = view.data
            printer.out.write(json.dumps(with_times(data, session.local)) + "\n")
            printer.out.flush()
        else:
            printer.show(view)
            printer.text("")
        shown += 1
        if count is not None and shown >= count:
            break
        time.sleep(interval_s)
