"""Any answer as a table (`-o table` on `gpufleet api` and `call`), GPU use cells as
nvidia-smi shows them, and short model names as the models agents report."""

from __future__ import annotations

import csv
import io

from ops.cli.fleet_views import models_matching
from ops.cli.generic import generic_view
from ops.cli.views import use_cells
from ops.kit.output import Printer, View

T = 1_800_000_000_000
PAGE = {
    "reservations": [
        {"reservationId": "rsv_1", "tenantId": "acme", "start": T, "spot": False,
         "atoms": [{"atomId": "n1:gpu:0", "nodeId": "n1", "class": "gpu"}]},
        {"reservationId": "rsv_2", "tenantId": "acme", "start": T, "spot": True, "atoms": []},
    ],
    "nextCursor": None,
    "window": {"from": T, "to": T + 3_600_000},
}  # fmt: skip


def _printed(view: View, fmt: str = "table") -> str:
    out = io.StringIO()
    Printer(fmt, False, out, False).show(view)  # type: ignore[arg-type]
    return out.getvalue()


def test_an_answer_prints_as_lines_and_a_table_per_list() -> None:
    text = _printed(generic_view(PAGE))
    assert not text.lstrip().startswith("{"), text
    assert "nextCursor: -" in text and "window.from: 2027-01-15T08:00:00Z" in text, text
    header = next(line for line in text.splitlines() if line.startswith("RESERVATIONID"))
    assert header.split()[:4] == ["RESERVATIONID", "TENANTID", "START", "SPOT"], header
    (first,) = [line for line in text.splitlines() if line.startswith("rsv_1")]
    assert "2027-01-15T08:00:00Z" in first and '"nodeId":"n1"' in first, first
    rows = list(csv.DictReader(io.StringIO(_printed(generic_view(PAGE), "csv"))))
    assert [r["reservationId"] for r in rows] == ["rsv_1", "rsv_2"]
    assert rows[0]["start"] == "2027-01-15T08:00:00Z"


def test_server_strings_in_a_generic_table_are_inert() -> None:
    text = _printed(generic_view({"reason": "\x1b]52;c;eA==\x07", "rows": [{"why": "\x1b[2J"}]}))
    assert "\x1b" not in text and "\\x1b]52;c;eA==\\x07" in text and "\\x1b[2J" in text


def test_use_cells_read_like_nvidia_smi() -> None:
    use = {
        "inUse": True, "smUtil": 85, "memoryUsedMib": 20480, "processes": 3,
        "users": [{"pid": 4242, "owner": "rsv_1", "ownerKind": "reservation"},
                  {"pid": 777, "owner": "uid-1", "ownerKind": "pod"}],
    }  # fmt: skip
    assert use_cells(use) == {
        "use": "busy", "sm": 85, "memory": "20480 MiB",
        "users": "4242 reservation:rsv_1, 777 pod:uid-1, +1 more",
    }  # fmt: skip
    assert use_cells(None) == {}
    idle = {"inUse": False, "smUtil": None, "memoryUsedMib": None, "processes": 0, "users": []}
    assert use_cells(idle) == {"use": "idle", "sm": None, "memory": None, "users": ""}


def test_a_short_model_name_stands_for_the_reported_ones() -> None:
    known = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA H100 NVL"]
    assert models_matching("h100", known) == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL"]
    assert models_matching("nvidia l40s", known) == ["NVIDIA L40S"]
    assert models_matching("B200", known) == []
