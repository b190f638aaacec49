"""The API and the workflows see the ledger only through what `coordinator.ledger`
exports: its modules (bookings, idempotency, …) and its connection stay private."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path
from typing import Any, cast, get_args, get_origin, get_type_hints

import coordinator.ledger
from coordinator.ledger import BookingBatch, Database, Ledger, UnitOfWork
from coordinator.ledger.snapshot import SnapshotCache

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
    """The API and the workflows, and with them every other product module outside the
    ledger (tasks, bus, wiring, operator tooling)."""
    exported = set(coordinator.ledger.__all__)
    paths = [*ROOT.rglob("*.py"), *(ROOT.parent / "ops").rglob("*.py")]
    outside = [p for p in paths if (ROOT / "ledger") not in p.parents]
    assert {"api", "services", "tasks", "bus"} <= {p.parent.name for p in outside}
    for path in sorted(outside):
        for module, name in _ledger_imports(path):
            assert module == "coordinator.ledger", f"{path} imports {module}"
            assert name in exported, f"{path} imports {name}, not in __all__"


def test_the_ledgers_connection_is_private() -> None:
    assert "db" not in coordinator.ledger.Ledger.__dict__
    assert not hasattr(coordinator.ledger.Ledger, "db")
    db = Database("sqlite:///:memory:")  # no connection is made until one is used
    ledger = Ledger(db)
    public = {n: v for n, v in vars(ledger).items() if not n.startswith("_")}
    assert "db" not in public and db not in public.values()


def _fixed_tuples(hint: Any, where: str) -> dict[str, Any]:
    """Fixed-length tuples (records read by position) anywhere in a type, and in the
    fields of the ledger's own dataclasses in it; `tuple[X, ...]` is a sequence and a
    dict's key may be composite."""
    origin, args = get_origin(hint), get_args(hint)
    found = {}
    if hint is tuple or (origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)):
        found[where] = hint
    if origin is dict:
        args = args[1:]
    for arg in args:
        if arg is not Ellipsis:
            found |= _fixed_tuples(arg, where)
    if dataclasses.is_dataclass(hint) and hint.__module__.startswith("coordinator.ledger"):
        for name, field_hint in get_type_hints(hint).items():
            found |= _fixed_tuples(field_hint, f"{where} -> {hint.__name__}.{name}")
    return found


def test_repositories_return_values_not_tuples() -> None:
    """Every public method of the ledger, its repositories, the unit of work and its
    writers returns named values (dataclasses), never a tuple read by position."""
    ledger = Ledger(cast(Database, None))  # repositories only keep the database
    uow = UnitOfWork(cast(Any, None), cast(Any, None), SnapshotCache())
    owners: list[object] = [ledger, uow, BookingBatch]
    for owner in (ledger, uow):
        owners += [v for n, v in vars(owner).items() if not n.startswith("_") and
                   not isinstance(v, bool | int | str)]  # fmt: skip
    tuples: dict[str, Any] = {}
    for owner in owners:
        cls = owner if isinstance(owner, type) else type(owner)
        for name, fn in inspect.getmembers(cls, callable):
            if not name.startswith("_"):
                returned = get_type_hints(fn).get("return")
                tuples |= _fixed_tuples(returned, f"{cls.__name__}.{name}")
    assert tuples == {}
