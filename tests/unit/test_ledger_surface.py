"""The API and the workflows see the ledger only through what `coordinator.ledger`
exports: its modules (bookings, idempotency, …) and its connection stay private."""

from __future__ import annotations

import ast
from pathlib import Path

import coordinator.ledger

ROOT = Path(__file__).resolve().parents[2] / "coordinator"


def _ledger_imports(path: Path) -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "coordinator.ledger"
        ):
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("coordinator.ledger")]
    return found


def test_api_and_services_import_only_the_ledgers_exports() -> None:
    exported = set(coordinator.ledger.__all__)
    for package in ("api", "services"):
        for path in sorted((ROOT / package).glob("*.py")):
            for module, name in _ledger_imports(path):
                assert module == "coordinator.ledger", f"{path.name} imports {module}"
                assert name in exported, f"{path.name} imports {name}, not in __all__"


def test_the_ledgers_connection_is_private() -> None:
    assert "db" not in coordinator.ledger.Ledger.__dict__
    assert not hasattr(coordinator.ledger.Ledger, "db")
