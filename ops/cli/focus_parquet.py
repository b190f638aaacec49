"""`gpufleet usage export --format focus-parquet`: the coordinator's FOCUS 1.2 CSV
stream written as Parquet on the caller's machine, with FOCUS's column types.

The coordinator streams CSV only (no Arrow on the server). Parquet needs pyarrow, the
optional `export` extra (`pip install 'gpufleet[cli,export]'`); without it the command
says so and writes nothing. The CSV is read in batches and each batch written as a row
group, so an export of any size holds one batch in memory. Types: the period columns
are `timestamp[ms, UTC]` (FOCUS Date/Time; Parquet has no seconds unit), quantities
and costs `decimal128(38, 10)` (FOCUS Decimal: the export's 10 places, never float),
every other column a string; an empty CSV cell is null (FOCUS's null).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, BinaryIO, ClassVar

from ops.kit.errors import OpsError

TIMES = ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd")
DECIMALS = ("ConsumedQuantity", "PricingQuantity", "ListCost", "BilledCost",
            "EffectiveCost", "ContractedCost")  # fmt: skip


class ParquetUnavailable(OpsError):
    """pyarrow is not installed: focus-parquet cannot be written (a usage error: the
    user asked for a format this install lacks)."""

    exit_code: ClassVar[int] = 2


def _arrow() -> Any:
    try:
        import pyarrow
        import pyarrow.csv
        import pyarrow.parquet
    except ImportError:
        raise ParquetUnavailable(
            "focus-parquet needs pyarrow: pip install 'gpufleet[cli,export]' (or use focus-csv)"
        ) from None
    return pyarrow


def column_types(names: list[str]) -> dict[str, Any]:
    pa = _arrow()
    types = {name: pa.string() for name in names}
    types.update({name: pa.timestamp("ms", tz="UTC") for name in TIMES if name in types})
    types.update({name: pa.decimal128(38, 10) for name in DECIMALS if name in types})
    return types


def csv_to_parquet(source: BinaryIO, target: str) -> int:
    """Write the FOCUS CSV in `source` (seekable, at its start) to `target` as Parquet;
    the number of rows. `target` is written whole or not at all."""
    pa = _arrow()
    header = source.readline().decode().strip()
    source.seek(0)
    names = header.split(",") if header else []
    reader = pa.csv.open_csv(
        source,
        convert_options=pa.csv.ConvertOptions(
            column_types=column_types(names), null_values=[""], strings_can_be_null=True,
            quoted_strings_can_be_null=True,
        ),
        read_options=pa.csv.ReadOptions(block_size=1 << 22),
    )  # fmt: skip
    rows = 0
    folder = os.path.dirname(os.path.abspath(target))
    fd, partial = tempfile.mkstemp(prefix=".focus-", suffix=".parquet", dir=folder)
    os.close(fd)
    try:
        with pa.parquet.ParquetWriter(partial, reader.schema, compression="zstd") as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
        os.replace(partial, target)
    except BaseException:
        os.unlink(partial)
        raise
    return rows


def spool() -> BinaryIO:
    """Where the CSV waits while it streams in (a file: Parquet is written at the end)."""
    return tempfile.TemporaryFile("w+b")
