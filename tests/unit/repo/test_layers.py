"""The layout README.md describes, as imports: shared (the wire contract, no I/O) <-
procs (process plumbing) <- agent; shared, procs <- coordinator (domain <- ledger <-
services <- api | bus | tasks); operator tooling in `ops/`, one folder per tool and a
kit, which nothing in the runtime imports; SQLAlchemy only in the ledger, aiohttp only
in the API, nats only in the bus (coordinator side). Any import counts, inside functions
too. The API may read the ledger, but writes only through a service."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
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


def _chain(node: ast.expr) -> list[str]:
    """`a.b.c` as ["a", "b", "c"]; [] for anything but names and attributes."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return [node.id, *reversed(names)] if isinstance(node, ast.Name) else []


def _ledger_writes() -> tuple[set[tuple[str, str]], dict[str, str]]:
    """Which ledger methods write, read off the code rather than listed: a function
    writes if it opens a write transaction (`Database.transaction()`, a unit of work) or
    calls a ledger function that does. Returns {(class, method)} and the `Ledger`
    facade's attribute → repository class."""
    funcs: dict[tuple[str, str], ast.AST] = {}  # (module, qualname) → body
    classes: dict[str, str] = {}  # class → module
    imported: dict[str, dict[str, str]] = {}  # module → local name → ledger module
    for path in _modules("coordinator/ledger"):
        mod = path.stem
        tree = ast.parse(path.read_text())
        imported[mod] = {
            alias.asname or alias.name: alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module == "coordinator.ledger"
            for alias in node.names
        }
        for node in tree.body:
            if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
                funcs[mod, node.name] = node
            elif isinstance(node, ast.ClassDef):
                classes[node.name] = mod
                for item in node.body:
                    if isinstance(item, ast.AsyncFunctionDef | ast.FunctionDef):
                        funcs[mod, f"{node.name}.{item.name}"] = item

    def callees(mod: str, qualname: str) -> tuple[bool, set[tuple[str, str]]]:
        opens, called = False, set()
        owner = qualname.rpartition(".")[0]
        for node in ast.walk(funcs[mod, qualname]):
            if not isinstance(node, ast.Call):
                continue
            chain = _chain(node.func)
            if chain and chain[-1] in {"transaction", "unit_of_work"}:
                opens = True
            if len(chain) == 2 and chain[0] == "self" and owner:
                called.add((mod, f"{owner}.{chain[1]}"))
            elif len(chain) == 2 and chain[0] in imported[mod]:
                called.add((imported[mod][chain[0]], chain[1]))
            elif len(chain) == 1:
                called.add((mod, chain[0]))
        return opens, called

    graph = {key: callees(*key) for key in funcs}
    writes = {key for key, (opens, _) in graph.items() if opens}
    grew = True
    while grew:
        more = {key for key, (_, called) in graph.items() if called & writes} - writes
        writes |= more
        grew = bool(more)
    facade = next(
        node
        for node in ast.walk(ast.parse((ROOT / "coordinator/ledger/facade.py").read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    repos = {
        target.attr: node.value.func.id
        for node in facade.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        for target in node.targets
        if isinstance(target, ast.Attribute)
    }
    methods = {q.partition(".") for (_, q) in writes if "." in q}
    return {(cls, method) for cls, _, method in methods}, repos


def _api_ledger_writes(path: Path) -> list[str]:
    writes, repos = _ledger_writes()
    tree = ast.parse(path.read_text())
    # A name bound to the ledger or a part of it (`repo = ctx.ledger.pools`) stands for
    # that chain: `repo.create` is `ctx.ledger.pools.create`.
    held = {
        target.id: chain
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
        for chain in [_chain(node.value)]
        if "ledger" in chain
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        written = _chain(node) if isinstance(node, ast.Attribute) else []
        chain = written
        if written and written[0] in held and "ledger" not in written:
            chain = [*held[written[0]], *written[1:]]
        if "ledger" not in chain:
            continue
        rest = chain[len(chain) - chain[::-1].index("ledger") :]
        if len(rest) == 1 and ("Ledger", rest[0]) in writes:
            found.append(".".join(written))
        elif len(rest) == 2 and (repos.get(rest[0], ""), rest[1]) in writes:
            found.append(".".join(written))
    return found


def test_the_ledger_write_rule_tells_a_write_from_a_read() -> None:
    writes, repos = _ledger_writes()
    assert {("PoolRepo", "create"), ("ApiKeyRepo", "ensure"), ("Ledger", "transaction")} <= writes
    assert not {("PoolRepo", "get"), ("ApiKeyRepo", "authenticate")} & writes
    assert repos["pools"] == "PoolRepo"


def test_the_ledger_write_rule_follows_a_repository_held_in_a_name(tmp_path: Path) -> None:
    """A repository (or the ledger) taken into a local name first is still the ledger."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "async def create(ctx, q):\n"
        "    repo = ctx.ledger.pools\n"
        "    await repo.create(q)\n"
        "    ledger = ctx.ledger\n"
        "    await ledger.pools.archive(q)\n"
        "    await ledger.pools.get(q)\n"
    )
    assert _api_ledger_writes(planted) == ["repo.create", "ledger.pools.archive"]


def test_the_api_reads_the_ledger_but_writes_only_through_services() -> None:
    """Reads may go straight to the ledger; every write is a workflow in services/."""
    wrong = [
        (path.relative_to(ROOT), write)
        for path in _modules("coordinator/api")
        for write in _api_ledger_writes(path)
    ]
    assert wrong == []


def test_only_the_wiring_imports_the_wiring() -> None:
    """wiring/ (one async context per resource) and app.py sit above every layer."""
    wrong = [
        (path.relative_to(ROOT), module)
        for path in _modules("coordinator")
        if path.relative_to(ROOT / "coordinator").parts[0] in LAYERS
        for module in _imports(path)
        if module.split(".")[:2] in (["coordinator", "wiring"], ["coordinator", "app"])
    ]
    assert wrong == []


def _module_graph(package: str) -> dict[str, set[str]]:
    """Each module of `package` → the modules of it that it imports: `from a import b`
    counts `a.b` when b is a module, else `a` (a package's `__init__` too)."""
    names = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in _modules(package)
    }
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in names] or [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in names and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", ["shared", "procs", "agent", "coordinator", "ops"])
def test_no_import_circles(package: str) -> None:
    """A package imports itself through a package `__init__` (`coordinator.api.methods`)
    too; an import inside a function, or only for type checking, still counts: it is a
    dependency a reader follows. (Between packages the layers above rule circles out.)"""
    assert _cycles(_module_graph(package)) == []


def test_the_api_groups_point_one_way() -> None:
    """shapes/ <- http/ <- methods/ <- the mount (api/app.py, api/docs.py)."""
    order = ["shapes", "http", "methods", ""]
    wrong = []
    for path in _modules("coordinator/api"):
        parts = path.relative_to(ROOT / "coordinator/api").parts
        group = parts[0] if len(parts) > 1 else ""
        for module in _imports(path):
            names = module.split(".")
            if names[:2] != ["coordinator", "api"] or len(names) < 3:
                continue
            target = names[2] if names[2] in order else ""
            if order.index(target) > order.index(group):
                wrong.append((path.relative_to(ROOT), module))
    assert wrong == []


def test_the_coordinators_root_holds_only_the_wiring() -> None:
    """Everything else lives in its layer, or in runtime/ (process plumbing)."""
    root = {p.stem for p in (ROOT / "coordinator").glob("*.py")}
    assert root == {"__init__", "app", "main", "config"}


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

# Libraries that mean a command line, files, sockets, a network, the standard streams or
# a process: plumbing, which lives in procs/.
NOT_IN_SHARED = {
    "aiohttp", "asyncio", "click", "http", "io", "logging", "nats", "pathlib", "shutil",
    "signal", "socket", "sqlalchemy", "ssl", "subprocess", "sys", "tempfile", "tomllib",
    "urllib",
}  # fmt: skip
OS_PURE = {"urandom"}  # os without files: randomness for ids


# Built-ins that read or write a file or a terminal.
IO_BUILTINS = {"open", "print", "input", "breakpoint"}


def _io_in_shared(path: Path) -> list[str]:
    wrong = [module for module in _imports(path) if module.split(".")[0] in NOT_IN_SHARED]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "os" and node.attr not in OS_PURE:
                wrong.append(f"os.{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in IO_BUILTINS:
                wrong.append(f"{node.func.id}()")
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            wrong += [f"os.{a.name}" for a in node.names if a.name not in OS_PURE]
    return wrong


def test_the_no_io_rule_sees_the_standard_streams(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("import sys\n\n\ndef say(x):\n    sys.stdout.write(x)\n    print(x)\n")
    assert _io_in_shared(planted) == ["sys", "print()"]


def test_shared_is_the_wire_contract_without_io() -> None:
    wrong = [
        (path.relative_to(ROOT), found)
        for path in _modules("shared")
        for found in _io_in_shared(path)
    ]
    assert wrong == []


# --- procs: the process plumbing, declared once ---------------------------------------

# What only procs/ calls: systemd's word, the root logger's set-up, signal handlers.
PLUMBING_CALLS = {"sd_notify", "basicConfig", "add_signal_handler", "remove_signal_handler"}


def _plumbing_calls(path: Path) -> list[str]:
    return [
        f"{chain[-1]}:{node.lineno}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        for chain in [_chain(node.func)]
        if chain and chain[-1] in PLUMBING_CALLS
    ]


def test_the_plumbing_rule_finds_a_daemon_of_its_own(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import logging\n\n\ndef main(loop, sock):\n"
        "    logging.basicConfig(level=logging.ERROR)\n"
        "    loop.add_signal_handler(15, loop.stop)\n"
        "    sd_notify('STOPPING=1', sock)\n"
    )
    assert _plumbing_calls(planted) == ["basicConfig:5", "add_signal_handler:6", "sd_notify:7"]


@pytest.mark.parametrize("package", ["shared", "agent", "coordinator", "ops"])
def test_only_procs_runs_a_daemon(package: str) -> None:
    """One run-until-signalled (`procs.signals`) for the coordinator, the agent and both
    ops daemons: none of them notifies systemd, sets up logging or handles a signal
    itself."""
    wrong = [
        (path.relative_to(ROOT), call)
        for path in _modules(package)
        for call in _plumbing_calls(path)
    ]
    assert wrong == []
