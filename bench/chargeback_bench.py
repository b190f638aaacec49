"""Chargeback (issue 35, SPEC §13): one month's consumption against reading the same
month's interval calendar, and the FOCUS export's rate against writing the same rows
with the standard csv module alone; SQLite and PostgreSQL.

`--pools` pools, two tenants per pool, each with an interval reservation of every
quarter of the month and memory use in every quarter, as the use pass writes it: one
`memory_use` row per quarter, tenant and pool, whatever the number of nodes behind it
(so 1,000 nodes cost a consumption read nothing that 10 do: the node count is not a
parameter; the tenants and pools are). Timed, each the median of `--repeat` reads:

- the calendar: one tenant's month in one pool (`IntervalRepo.reservable`, what
  `GET /api/capacity/calendar` reads), the baseline;
- the same tenant's month of consumption (`services.consumption.memory_consumption`),
  goal <= 5x the baseline; and the whole fleet's month (every tenant), beside it;
- the export of the fleet's month (FOCUS rows priced by a rate card, CSV chunks) in
  rows/s, against `csv.writer.writerows` of the same cells, goal >= 0.5x: each repeat
  times one beside the other, and the ratio is the median of the repeats' ratios, in
  this process's CPU time (the goal: other processes' load on a shared machine does
  not move it) and in wall time (beside it; rows/s are wall).

    .venv/bin/python bench/chargeback_bench.py --pools 10 --days 30
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet import postgres_database, postgres_reachable
from report import Goal, write

from coordinator.domain.consumption import MemoryAccrued, MemoryKey
from coordinator.domain.focus import COLUMNS, csv_chunks, memory_rows
from coordinator.domain.intervals import INTERVAL_MS as Q
from coordinator.domain.intervals import Interval
from coordinator.domain.rate_card import parse_rate_card
from coordinator.ledger import Ledger
from coordinator.services.consumption import memory_consumption, memory_export, pool_places

T0 = 1_800_000_000_000 // Q * Q
CARD = parse_rate_card(
    'currency = "EUR"\n[[rate]]\nresource = "memory_gb"\nmodel = "*"\nreserved = "0.01"\n'
    'on_demand = "0.02"\neffective_from = 2020-01-01\n',
    "bench",
)


def _median(samples: list[float]) -> float:
    return statistics.median(samples)


async def _fill(ledger: Ledger, pools: int, quarters: int) -> None:
    for p in range(pools):
        pool = f"pool_{p:02d}"
        for t in range(2):
            tenant = f"tenant-{p:02d}-{t}"
            async with ledger.transaction() as uow:
                month = [Interval(T0 + k * Q, T0 + k * Q + Q, 32) for k in range(quarters)]
                await uow.intervals.book(tenant, pool, month, T0)
                await uow.commit()
            used = {
                MemoryKey(T0 + k * Q, tenant, pool): MemoryAccrued(
                    (16 + (k * 7 + p + t) % 32) * 1024 * Q, (20 + k % 30) * 1024
                )
                for k in range(quarters)
            }
            await ledger.gpu_use.record({}, [], [], memory=used)


async def run_backend(url: str, pools: int, days: int, repeat: int) -> dict[str, Any]:
    quarters = days * 96
    ledger = await Ledger.open(url)
    try:
        t0 = time.perf_counter()
        await _fill(ledger, pools, quarters)
        fill_s = time.perf_counter() - t0
        end = T0 + quarters * Q
        tenant, pool = "tenant-00-0", "pool_00"
        grid = list(range(T0, end, Q))
        calendar, own, fleet = [], [], []
        for _ in range(repeat):
            t = time.perf_counter()
            await ledger.intervals.reservable(tenant, pool, grid)
            calendar.append(time.perf_counter() - t)
            t = time.perf_counter()
            await memory_consumption(ledger, T0, end, tenant, None)
            own.append(time.perf_counter() - t)
            t = time.perf_counter()
            rows = await memory_consumption(ledger, T0, end, None, None)
            fleet.append(time.perf_counter() - t)
        rows, commitments = await memory_export(ledger, T0, end, None, None)
        places = await pool_places(ledger, {r.pool_id for r in rows})
        cells = list(memory_rows(rows, commitments, places, CARD))

        def write_export() -> int:
            return sum(len(c) for c in csv_chunks(memory_rows(rows, commitments, places, CARD)))

        def write_plain() -> int:
            buf = io.StringIO()
            w = csv.writer(buf)
            w.writerow(COLUMNS)
            w.writerows(cells)
            return len(buf.getvalue().encode())

        # (CPU s, wall s) of each: pure Python in this process, so its CPU time is what
        # the load of other processes on a shared machine does not move.
        export: list[tuple[float, float]] = []
        plain: list[tuple[float, float]] = []
        for _ in range(repeat):
            for write, into in ((write_export, export), (write_plain, plain)):
                c, t = time.process_time(), time.perf_counter()
                size = write()
                into.append((time.process_time() - c, time.perf_counter() - t))
        cal, mine, all_ = _median(calendar), _median(own), _median(fleet)
        ex, pl = _median([w for _, w in export]), _median([w for _, w in plain])
        # Each export timed beside a csv run of the same cells: the median of those pairs'
        # ratios, so a load that moves between repeats moves both sides.
        cpu = _median([p[0] / e[0] for p, e in zip(plain, export, strict=True)])
        wall = _median([p[1] / e[1] for p, e in zip(plain, export, strict=True)])
        return {
            "pools": pools, "tenants": 2 * pools, "days": days,
            "consumption_rows": len(rows), "export_rows": len(cells), "export_bytes": size,
            "fill_s": round(fill_s, 2),
            "calendar_ms": round(cal * 1000, 2), "tenant_consumption_ms": round(mine * 1000, 2),
            "fleet_consumption_ms": round(all_ * 1000, 2),
            "tenant_over_calendar": round(mine / cal, 2),
            "fleet_over_calendar": round(all_ / cal, 2),
            "export_rows_per_s": round(len(cells) / ex), "csv_rows_per_s": round(len(cells) / pl),
            "export_over_csv": round(cpu, 2), "export_over_csv_wall": round(wall, 2),
        }  # fmt: skip
    finally:
        await ledger.close()


async def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--pools", type=int, default=10)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = await run_backend(f"sqlite:///{tmp}/c.db", a.pools, a.days, a.repeat)
    if await postgres_reachable():
        async with postgres_database("chargeback") as url:
            results["postgresql"] = await run_backend(url, a.pools, a.days, a.repeat)
    goals = []
    for backend, r in results.items():
        goals.append(
            Goal(
                f"{backend}: a tenant's {a.days}-day consumption",
                f"{r['tenant_consumption_ms']} ms",
                f"{r['tenant_over_calendar']}x its calendar ({r['calendar_ms']} ms)", "<= 5x",
                r["tenant_over_calendar"] <= 5,
            )
        )  # fmt: skip
        goals.append(
            Goal(
                f"{backend}: FOCUS export, {r['export_rows']:,} rows",
                f"{r['export_rows_per_s']:,} rows/s",
                f"{r['export_over_csv']}x csv alone in CPU time ({r['export_over_csv_wall']}x"
                f" wall; csv {r['csv_rows_per_s']:,} rows/s)", ">= 0.5x",
                r["export_over_csv"] >= 0.5,
            )
        )  # fmt: skip
    for backend, r in results.items():
        print(
            f"{backend}: the whole fleet's month ({r['tenants']} tenants, "
            f"{r['consumption_rows']:,} rows) in {r['fleet_consumption_ms']} ms, "
            f"{r['fleet_over_calendar']}x one calendar"
        )
    return write("chargeback", results, goals)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
