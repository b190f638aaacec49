"""Each value list (reservation states, atom and device classes, health, buckets, node
statuses) is declared once, in `shared/` or `coordinator/domain/`, and imported
everywhere else: no other module of the product spells all of its values out again in a
tuple, list, set or `Literal[...]`, so a value added in one place cannot be missing in
another."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from coordinator.domain import model, risk
from shared import reservation_states, wire

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("shared", "agent", "coordinator", "ops")
# Migrations are history: each keeps the values as they were when it was written.
FROZEN = ROOT / "coordinator" / "ledger" / "migrations"
# Collections that hold every value of a list as part of another concept.
OTHER_CONCEPTS = {
    # A rollup row's counted columns: its total, the allocatable bucket's split, and
    # one count per other bucket.
    ("shared/counts.py", "COUNT_COLUMNS"),
}

LISTS = {
    "reservation states": (reservation_states.RESERVATION_STATES, "shared/reservation_states.py"),
    "device classes": (wire.DEVICE_CLASSES, "shared/wire.py"),
    "health": (get_args(wire.HealthStatus), "shared/wire.py"),
    "buckets": (model.ROLLUP_BUCKETS, "coordinator/domain/model.py"),
    "node statuses": (model.NODE_STATUSES, "coordinator/domain/model.py"),
    "at-risk reasons": (risk.AT_RISK_REASONS, "coordinator/domain/risk.py"),
}


def _strings(node: ast.AST) -> set[str] | None:
    """The string constants a collection or `Literal[...]` spells out; None otherwise."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        if node.value.id != "Literal":
            return None
        node = node.slice
        if isinstance(node, ast.Constant):
            return {node.value} if isinstance(node.value, str) else None
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        }
    return None


def _assigned_names(tree: ast.Module) -> dict[int, str]:
    """Which top-level name each line's value is assigned to (for the allow list)."""
    names: dict[int, str] = {}
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        for target in targets:
            if isinstance(target, ast.Name):
                for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1):
                    names[line] = target.id
    return names


def declarations(values: tuple[str, ...]) -> list[str]:
    """Every module (and line) spelling out all of `values` in one collection."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if FROZEN in path.parents:
                continue
            tree = ast.parse(path.read_text())
            rel = path.relative_to(ROOT).as_posix()
            names = _assigned_names(tree)
            # A `Literal[...]`'s tuple is the same declaration as the Literal.
            inner = {
                id(n.slice)
                for n in ast.walk(tree)
                if isinstance(n, ast.Subscript) and _strings(n) is not None
            }
            for node in ast.walk(tree):
                strings = None if id(node) in inner else _strings(node)
                if strings is None or not set(values) <= strings:
                    continue
                if (rel, names.get(node.lineno)) not in OTHER_CONCEPTS:
                    found.append(f"{rel}:{node.lineno}")
    return found


@pytest.mark.parametrize("name", LISTS)
def test_each_value_list_is_declared_once(name: str) -> None:
    values, home = LISTS[name]
    found = declarations(values)
    assert [where.split(":")[0] for where in found] == [home], found


def test_the_scan_finds_a_second_declaration(tmp_path: Path) -> None:
    """The scan recognises a copy, in any of the forms one is written."""
    copies = [
        'X = ("scheduled", "active", "noticed", "completed", "released", "expired",'
        ' "preempted", "live")',
        'X = Literal["allocatable", "provisioning", "unhealthy", "maintenance", "unreachable"]',
        'X = ["ready", "degraded", "provisioning", "unhealthy", "maintenance", "unreachable"]',
    ]
    for source, values in zip(
        copies,
        (reservation_states.RESERVATION_STATES, model.ROLLUP_BUCKETS, model.NODE_STATUSES),
        strict=True,
    ):
        tree = ast.parse(source)
        assert any(set(values) <= (_strings(n) or set()) for n in ast.walk(tree)), source


def test_runtime_tuples_are_the_literals_args() -> None:
    assert reservation_states.RESERVATION_STATES == get_args(reservation_states.ReservationState)
    assert wire.ATOM_CLASSES == (*wire.DEVICE_CLASSES, "node")
    assert model.ROLLUP_BUCKETS == get_args(model.RollupBucket)
    assert model.NODE_STATUSES == get_args(model.NodeStatus)
    assert risk.AT_RISK_REASONS == get_args(risk.AtRiskReason)
    assert set(reservation_states.LIVE_STATES) | set(reservation_states.TERMINAL_STATES) < set(
        reservation_states.RESERVATION_STATES
    )
