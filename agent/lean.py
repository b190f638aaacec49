"""What the agent process leaves out of its imports, and the stand-ins that let it.

The agent's budget is 40 MB resident on an 8-GPU host (SPEC §8, bench/agent_bench.py),
and nearly all of it is imported code. Its libraries load, on every start, code that
the agent needs only on paths it rarely or never takes:

- nats-py's client imports its JetStream package (`nats.js`: a dataclass for every API
  object, key-value and object stores, with `email`: ~1.8 MB) at its top, for a few
  header names on its request and status-header paths. The agent never uses JetStream:
  `nats.js` is loaded on first use instead, so those paths still work.
- nats-py (its own version) and the agent (`agent.main._version`) read a package's
  version through `importlib.metadata`, which imports `email`, `zipfile` and `csv`
  (~1.5 MB). `version` here reads the `.dist-info` directly; anything else of
  `importlib.metadata`, or a package not found that way, loads the real module.
- pydantic looks for plugins (package entry points, through `importlib.metadata`) when
  it builds the first model. The agent has no pydantic plugins and a GPU host installs
  none (`gpufleet[agent]`), so the agent process tells pydantic there are none.

Only the process entry point (`agent.daemon`) calls `leave_out_unused_imports`; tests
and tools that import the agent's modules get the libraries as they are.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

__all__ = ["dist_version", "leave_out_unused_imports"]


def dist_version(name: str) -> str | None:
    """The version of installed distribution `name` from its `.dist-info/METADATA` on
    `sys.path` (first found, as `importlib.metadata.version` searches); None if none."""
    normal = re.sub(r"[-_.]+", "_", name).lower()
    for entry in sys.path:
        try:
            found = sorted(Path(entry or ".").glob("*.dist-info/METADATA"))
        except OSError:
            continue
        for meta in found:
            if meta.parent.name.partition("-")[0].lower() != normal:
                continue
            try:
                lines = meta.read_text().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            for line in lines:
                if line.startswith("Version:"):
                    return line.partition(":")[2].strip()
    return None


def _version(name: str) -> str:
    """`importlib.metadata.version`, cheaply when the `.dist-info` is on `sys.path`."""
    found = dist_version(name)
    if found is not None:
        return found
    real: Any = _load_real("importlib.metadata")
    return str(real.version(name))


class _StandIn(types.ModuleType):
    """Takes a module's place until it is used: reading any attribute it does not have
    imports the real module, which then takes its place in `sys.modules` and on its
    package. It is no package (`import nats.js.api` fails while it stands in; `nats.js.api`
    and `from nats.js import api` load the real one): the import system asks for
    `__path__` on every `from … import`, which must not count as a use."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)  # the import system probing it
        return getattr(_load_real(self.__name__), name)


def _load_real(name: str) -> types.ModuleType:
    if isinstance(sys.modules.get(name), _StandIn):
        del sys.modules[name]
    return importlib.import_module(name)


class _StandInFinder:
    """Answers the first import of each named module with a `_StandIn` (holding the
    given attributes), through the import system so that its package gets it too."""

    def __init__(self, stand_ins: dict[str, dict[str, Any]]) -> None:
        self.stand_ins = stand_ins

    def find_spec(self, name: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if name not in self.stand_ins:
            return None
        return ModuleSpec(name, cast("Loader", self))  # a loader by its two methods

    def create_module(self, spec: ModuleSpec) -> types.ModuleType:
        return _StandIn(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        # Once only: importing the real module must find the real module.
        module.__dict__.update(self.stand_ins.pop(module.__name__))
        if not self.stand_ins and self in sys.meta_path:
            sys.meta_path.remove(self)


def leave_out_unused_imports() -> None:
    """Installs the stand-ins for what is not imported yet (see the module docstring)."""
    stand_ins: dict[str, dict[str, Any]] = {}
    if "importlib.metadata" not in sys.modules:
        stand_ins["importlib.metadata"] = {"version": _version}
    if "nats" not in sys.modules:
        stand_ins["nats.js"] = {}
    if "pydantic" not in sys.modules:
        # Not a stand-in: pydantic's plugin loader, saying there are none.
        loader = types.ModuleType("pydantic.plugin._loader")
        loader.get_plugins = lambda: ()  # type: ignore[attr-defined]
        sys.modules[loader.__name__] = loader
    if stand_ins:
        sys.meta_path.insert(0, _StandInFinder(stand_ins))
