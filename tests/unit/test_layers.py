"""The layout README.md describes, as imports: shared (the wire contract, no I/O) <-
procs (process plumbing) <- agent; shared, procs <- coordinator (domain <- ledger <-
services <- api | bus | tasks); operator tooling in `ops/`, one folder per tool and a
kit, which nothing in the runtime imports; SQLAlchemy only in the ledger, aiohttp only in the API,
nats only in the bus (coordinator side). Any import counts, inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# `runtime` (metrics, the GC pause) is process plumbing any layer above the
# ledger may use; it imports the domain only.
LAYERS = ["domain", "ledger", "runtime", "services", "api", "bus", "tasks"]
# The entrypoints at the top: none of them imports another.
ENTRYPOINTS = {"api", "bus", "tasks"}
ONLY_IN = {"sqlalchemy": "ledger", "aiohttp": "api", "nats": "bus"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", ["shared", "procs", "agent", "coordinator"])
def test_the_runtime_never_imports_operator_tooling_or_the_other_side(package: str) -> None:
    refused = {
        "shared": {"procs", "agent", "coordinator", "ops"},
        "procs": {"agent", "coordinator", "ops"},
        "agent": {"coordinator", "ops"},
        "coordinator": {"agent", "ops"},
    }[package]
    wrong = [
        (path.relative_to(ROOT), module)
        for path in _modules(package)
        for module in _imports(path)
        if module.split(".")[0] in refused
    ]
    assert wrong == []


def test_coordinator_layers_point_one_way_and_each_library_has_one_home() -> None:
    wrong = []
    for path in _modules("coordinator"):
        parts = path.relative_to(ROOT / "coordinator").parts
        layer = parts[0] if len(parts) > 1 else ""  # "" is the top level: the wiring
        for module in _imports(path):
            names = module.split(".")
            home = ONLY_IN.get(names[0])
            if home is not None and layer != home:
                wrong.append((path.relative_to(ROOT), module, f"only {home}/ imports it"))
            if layer not in LAYERS or names[0] != "coordinator" or len(names) < 2:
                continue
            target = names[1]
            if target not in LAYERS or target == layer:
                continue
            if layer in ENTRYPOINTS and target in ENTRYPOINTS:
                wrong.append((path.relative_to(ROOT), module, "entrypoints are siblings"))
            elif LAYERS.index(target) > LAYERS.index(layer):
                wrong.append((path.relative_to(ROOT), module, "points up"))
    assert wrong == []


def test_the_coordinators_root_holds_only_the_wiring() -> None:
    """Everything else lives in its layer, or in runtime/ (process plumbing)."""
    root = {p.stem for p in (ROOT / "coordinator").glob("*.py")}
    assert root == {"__init__", "app", "main", "config", "errors"}


def test_the_agent_reaches_its_simulator_only_from_its_wiring() -> None:
    """agent/sim/ is the GPU-less host; production modules never import it, only the
    entry point, the settings (which check a profile name) and the one-shot report."""
    wiring = {"main", "config", "inventory_report"}
    wrong = [
        (path.relative_to(ROOT), module)
        for path in sorted((ROOT / "agent").glob("*.py"))
        if path.stem not in wiring
        for module in _imports(path)
        if module.startswith("agent.sim")
    ]
    assert wrong == []


# --- ops: one folder per tool, one declared kit ---------------------------------------

OPS_TOOLS = {"cli", "demo", "natsauth", "forwarder", "slurm"}
# What every tool may import besides its own folder: the kit, the wire contract, the
# process plumbing.
OPS_SHARED = {"ops.kit", "shared", "procs"}


def _ops_room(path: Path) -> str:
    return path.relative_to(ROOT / "ops").parts[0]


def test_ops_holds_only_its_mount_and_one_folder_per_tool() -> None:
    ops = ROOT / "ops"
    assert {p.name for p in ops.glob("*.py")} == {"__init__.py", "main.py"}
    folders = {p.name for p in ops.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == OPS_TOOLS | {"kit"}


def test_nothing_in_the_product_imports_the_ops_mount() -> None:
    wrong = [
        (path.relative_to(ROOT), module)
        for package in ("shared", "agent", "coordinator", "ops", "bench")
        for path in _modules(package)
        for module in _imports(path)
        if module == "ops.main" or module.startswith("ops.main.")
    ]
    assert wrong == []


def _within(module: str, prefixes: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("room", sorted(OPS_TOOLS | {"kit"}))
def test_an_ops_tool_imports_only_the_kit_shared_and_itself(room: str) -> None:
    """Never another tool, never the coordinator or the agent; the kit only shared."""
    allowed = {f"ops.{room}", "shared", "procs"} | (set() if room == "kit" else OPS_SHARED)
    wrong = [
        (path.relative_to(ROOT), module)
        for path in _modules(f"ops/{room}")
        for module in _imports(path)
        if module.split(".")[0] in {"ops", "shared", "procs", "coordinator", "agent"}
        and not _within(module, allowed)
    ]
    assert wrong == []


# --- shared: the wire contract only ---------------------------------------------------

# Libraries that mean a command line, files, sockets, a network or a process: plumbing,
# which lives in procs/.
NOT_IN_SHARED = {
    "aiohttp", "asyncio", "click", "http", "io", "logging", "nats", "pathlib", "shutil",
    "signal", "socket", "sqlalchemy", "ssl", "subprocess", "tempfile", "tomllib", "urllib",
}  # fmt: skip
OS_PURE = {"urandom"}  # os without files: randomness for ids


def test_shared_is_the_wire_contract_without_io() -> None:
    wrong = []
    for path in _modules("shared"):
        tree = ast.parse(path.read_text())
        for module in _imports(path):
            if module.split(".")[0] in NOT_IN_SHARED:
                wrong.append((path.relative_to(ROOT), module))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "os" and node.attr not in OS_PURE:
                    wrong.append((path.relative_to(ROOT), f"os.{node.attr}"))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id == "open":
                    wrong.append((path.relative_to(ROOT), "open()"))
            if isinstance(node, ast.ImportFrom) and node.module == "os":
                wrong += [(path.relative_to(ROOT), f"os.{a.name}") for a in node.names
                          if a.name not in OS_PURE]  # fmt: skip
    assert wrong == []
