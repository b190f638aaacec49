"""The API and the workflows see the ledger only through what `coordinator.ledger`
exports, and it exports storage only: its modules (bookings, idempotency, …) and its
connection stay private, and values and rules are the domain's."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path
from typing import Any, cast, get_args, get_origin, get_type_hints

import coordinator.ledger
from coordinator.domain.errors import Unavailable
from coordinator.ledger import BookingBatch, Database, Ledger, UnitOfWork
from coordinator.ledger.snapshot import SnapshotCache

ROOT = Path(__file__).resolve().parents[4] / "coordinator"

# The facade: the ledger and what it stands on, the unit of work and the writers it
# hands out, the query shapes a caller builds or keeps, and the storage failures.
STORAGE = {
    "Ledger", "Database", "Leadership",
    "UnitOfWork", "BookingBatch", "NodeWriter",
    "ReservationFilter", "GpuFilter", "OutboxBacklog",
    "LedgerUnavailable", "NotLeader", "WriteRaced",
}  # fmt: skip


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


def test_the_ledger_exports_its_facade_and_nothing_else() -> None:
    assert set(coordinator.ledger.__all__) == STORAGE
    assert {n for n in vars(coordinator.ledger) if not n.startswith("_")} - STORAGE <= {
        n for n, v in vars(coordinator.ledger).items() if inspect.ismodule(v)
    }  # the package's own modules are attributes of it, but not exports


def _signature_types(owner: type) -> set[type]:
    """Every class named in a public method's parameters or return, unwrapped."""
    found: set[type] = set()

    def walk(hint: Any) -> None:
        if isinstance(hint, type):
            found.add(hint)
        for arg in hint if isinstance(hint, list) else get_args(hint):  # Callable's params
            walk(arg)

    for name, fn in inspect.getmembers(owner, callable):
        if not name.startswith("_") or name == "__init__":
            for hint in get_type_hints(fn).values():
                walk(hint)
    return found


def _storage_is_not(name: str, value: object, in_signatures: set[type]) -> str | None:
    """Why an exported name is not storage, None when it is."""
    if not isinstance(value, type):
        return "not a class: functions and rules are the domain's"
    if not value.__module__.startswith("coordinator.ledger."):
        return f"defined in {value.__module__}, not in the ledger"
    if issubclass(value, BaseException):
        if not issubclass(value, Unavailable):
            return "an error a client acts on is the domain's; storage fails as Unavailable"
    elif dataclasses.is_dataclass(value) and value not in in_signatures:
        return "a value no repository takes or returns"
    return None


def test_every_export_is_storage() -> None:
    """Classes of the ledger only; an error is a storage failure (the work may be
    retried), a plain value is what a repository takes or returns (a query's shape)."""
    ledger = Ledger(cast(Database, None))  # repositories only keep the database
    repos = [type(v) for n, v in vars(ledger).items() if not n.startswith("_")]
    in_signatures = set().union(*(_signature_types(c) for c in [Ledger, UnitOfWork, *repos]))
    exported = {n: getattr(coordinator.ledger, n) for n in coordinator.ledger.__all__}
    wrong = {n: why for n, v in exported.items() if (why := _storage_is_not(n, v, in_signatures))}
    assert wrong == {}


def test_the_storage_rule_refuses_what_the_domain_owns() -> None:
    """What the facade once exported and the domain now owns fails the rule."""
    from coordinator.domain.errors import UnknownPool
    from coordinator.domain.idempotency import Recorded, body_hash
    from coordinator.ledger.catalog import NodePage
    from coordinator.ledger.node_writer import InventoryRefused

    in_signatures: set[type] = set()
    for value in (body_hash, Recorded, UnknownPool, InventoryRefused, NodePage):
        assert _storage_is_not("x", value, in_signatures) is not None, value


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
