"""What CONTRIBUTING.md says of the tree holds: every test folder its "Tests: where to
start" names exists, and every module in the product that annotates anything says `from
__future__ import annotations` (the project's rule; a module that does not evaluates its
annotations at import time)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _named_folders(text: str) -> list[str]:
    """`tests/unit/<package>/` and `tests/integration/<package>/` with the folders listed
    under each: `a/{b,c}` is a/b and a/c."""
    section = text.split("## Tests: where to start", 1)[1].split("\n## ", 1)[0]
    found = []
    for kind in ("unit", "integration"):
        item = section.split(f"- `tests/{kind}/<package>/`", 1)[1].split("\n- ", 1)[0]
        item = re.sub(r"\s*\n\s*", "", item.split("The folders are", 1)[-1])
        for name in re.findall(r"`([a-z_/{},]+)`", item):
            base, _, inner = name.partition("/{")
            parts = inner.rstrip("}").split(",") if inner else [""]
            found += [f"tests/{kind}/{base}/{part}".rstrip("/") for part in parts]
    return found


def test_the_named_test_folders_exist() -> None:
    named = _named_folders((ROOT / "CONTRIBUTING.md").read_text())
    assert "tests/unit/coordinator/domain" in named
    assert "tests/integration/coordinator/app" in named
    assert [n for n in named if not (ROOT / n / "__init__.py").exists()] == []


@pytest.mark.parametrize("package", ["shared", "procs", "agent", "coordinator", "ops"])
def test_every_module_defers_its_annotations(package: str) -> None:
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        annotated = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.AnnAssign)
        if not any(isinstance(node, annotated) for node in ast.walk(tree)):
            continue  # nothing annotated (a package's names, re-exported)
        future = any(
            isinstance(node, ast.ImportFrom)
            and node.module == "__future__"
            and any(a.name == "annotations" for a in node.names)
            for node in tree.body
        )
        if not future:
            wrong.append(str(path.relative_to(ROOT)))
    assert wrong == []
