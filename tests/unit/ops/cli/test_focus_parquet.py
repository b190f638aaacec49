"""`--format focus-parquet` on the caller's machine (issue 35): FOCUS's types per
column, nothing written without pyarrow or from a CSV that does not convert, and the
target replaced whole."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from coordinator.domain.focus import COLUMNS
from ops.cli import focus_parquet
from ops.cli.focus_parquet import ParquetUnavailable, csv_to_parquet

ROW = dict.fromkeys(COLUMNS, "x") | {
    "BillingPeriodStart": "2026-12-01T00:00:00Z", "BillingPeriodEnd": "2027-01-01T00:00:00Z",
    "ChargePeriodStart": "2026-12-01T10:00:00Z", "ChargePeriodEnd": "2026-12-01T10:15:00Z",
    "ConsumedQuantity": "4.0000000000", "PricingQuantity": "4.0000000000",
    "ListCost": "0.0400000000", "BilledCost": "0.0400000000", "EffectiveCost": "0.0400000000",
    "ContractedCost": "0.0400000000", "CapacityReservationId": "", "RegionId": "",
}  # fmt: skip


def _csv(*rows: dict[str, str]) -> io.BytesIO:
    """As the coordinator streams it: a header, then rows (RFC 4180)."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return io.BytesIO(text.getvalue().encode())


def test_columns_are_typed_and_empty_cells_are_null(tmp_path: Path) -> None:
    target = tmp_path / "focus.parquet"
    assert csv_to_parquet(_csv(ROW, ROW), str(target)) == 2
    table = pq.read_table(target)
    types = {f.name: str(f.type) for f in table.schema}
    assert types["ChargePeriodStart"] == "timestamp[ms, tz=UTC]"
    assert types["BilledCost"] == types["ConsumedQuantity"] == "decimal128(38, 10)"
    assert types["SubAccountId"] == "string"
    first = table.to_pylist()[0]
    assert first["CapacityReservationId"] is None and first["RegionId"] is None
    assert str(first["BilledCost"]) == "0.0400000000"
    # No rows: the header alone still gives the typed, empty table.
    assert csv_to_parquet(_csv(), str(target)) == 0
    assert pq.read_table(target).num_rows == 0
    assert [p.name for p in tmp_path.iterdir()] == ["focus.parquet"]


def test_a_csv_that_does_not_convert_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "focus.parquet"
    target.write_bytes(b"old")
    with pytest.raises(pa.ArrowInvalid):
        csv_to_parquet(_csv(ROW | {"BilledCost": "0.01 EUR"}), str(target))
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["focus.parquet"]  # no temporary left


def test_without_pyarrow_it_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("pyarrow", "pyarrow.csv", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ParquetUnavailable, match=r"gpufleet\[cli,export\]"):
        focus_parquet.column_types([])
