"""Mutation testing of the domain (issue 23; issue 31 added the booking decision and the
use accounting): mutmut mutates coordinator/domain/{placer,placement_model,node_fit,
claims,free_index,intervals,liveness,booking,booked_hours,gpu_use_accrual,gpu_use_join,
gpu_use_units,gpu_use_book,gpu_use_report}.py one change at a time and runs the fast
unit tests that cover each mutated function; a mutant the tests still pass on
("survived") is a behaviour no fast test pins down. Prints killed and survived, lists the
survivors (with their diffs in the JSON), and writes bench/results/mutation.json. Goal:
at least 95 % of the mutants killed (issue 31).

    .venv/bin/python bench/mutation_bench.py [--modules placer,claims] [--jobs 2]
        [--timeout 7200] [--keep]

mutmut works on a copy of the tree: the run builds one in a scratch directory (the
packages, the tests, pyproject.toml, and a setup.cfg naming what to mutate), so the
checkout gets no `mutants/` folder and no mutmut section. Survivors that are equivalent
mutants, or behaviour nothing relies on, are listed with a one-line reason in
bench/README.md ("Mutation testing").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import Goal, write

ROOT = Path(__file__).resolve().parent.parent
DOMAIN = "coordinator/domain"
MODULES = (
    "placer", "placement_model", "node_fit", "claims", "free_index", "intervals", "liveness",
    # Issue 31: the booking decision and the use accounting.
    "booking", "booked_hours", "gpu_use_accrual", "gpu_use_join", "gpu_use_units",
    "gpu_use_book", "gpu_use_report",
)  # fmt: skip
# The fast unit tests that exercise those modules (seconds in all, no database, no NATS):
# mutmut maps each test to the functions it runs and runs only those per mutant.
TESTS = (
    "tests/unit/coordinator/domain/test_placer.py",
    "tests/unit/coordinator/domain/test_placer_properties.py",
    "tests/unit/coordinator/domain/test_placer_truth.py",
    "tests/unit/coordinator/domain/test_free_index.py",
    "tests/unit/coordinator/domain/test_liveness.py",
    "tests/unit/coordinator/domain/test_liveness_rules.py",
    "tests/unit/coordinator/domain/test_truth_domain.py",
    "tests/unit/coordinator/domain/test_gang_placement.py",
    "tests/unit/coordinator/domain/test_interval_rules.py",
    "tests/unit/coordinator/domain/test_liveness_edges.py",
    "tests/unit/coordinator/domain/test_claims_and_counts.py",
    "tests/unit/coordinator/domain/test_placer_answers.py",
    "tests/unit/coordinator/domain/test_node_fit.py",
    "tests/unit/coordinator/api/test_inputs.py",
    "tests/unit/coordinator/domain/test_booking_decision.py",
    "tests/unit/coordinator/domain/test_placer_busy.py",
    "tests/unit/coordinator/domain/test_usage.py",
    "tests/unit/coordinator/domain/test_use_accounting.py",
    "tests/unit/coordinator/domain/test_use_arithmetic.py",
    "tests/unit/coordinator/domain/test_use_book.py",
    "tests/unit/coordinator/domain/test_use_join.py",
    "tests/unit/coordinator/domain/test_booking_answers.py",
    "tests/unit/coordinator/domain/test_use_join_details.py",
    "tests/unit/coordinator/domain/test_use_accrual_keys.py",
    "tests/unit/coordinator/domain/test_use_report_edges.py",
    # Chargeback's and the FOCUS export's arithmetic and the use gate run the use
    # modules too (unbooked use per tenant, owners' memory beside GPU use).
    "tests/unit/coordinator/domain/test_consumption.py",
    "tests/unit/coordinator/domain/test_focus.py",
    "tests/unit/coordinator/domain/test_use_gate.py",
    # The snapshot cache forks the kept free counts for each batch (`FreeCounts.fork`).
    "tests/unit/coordinator/domain/test_pool_cache.py",
)
# A pytest plugin for the scratch tree, loaded before any test module: the property
# tests' hypothesis settings inherit its profile, which skips shrinking (a mutant is
# killed by its first failing example; shrinking it costs seconds and says nothing
# more) and the example database.
PROFILE = "mutation_profile"
PROFILE_PLUGIN = """from hypothesis import Phase, settings

settings.register_profile(
    "mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate], database=None
)
settings.load_profile("mutation")
"""
PACKAGES = ("coordinator", "shared", "procs", "agent", "ops", "tests")
GOAL_KILLED = 0.95
# mutmut's exit-code statuses that count as the tests noticing the mutant.
KILLED = ("killed", "timeout", "segfault")


def _status(code: int | None) -> str:
    return {
        1: "killed",
        3: "killed",
        0: "survived",
        5: "no tests",
        33: "no tests",
        34: "skipped",
        35: "suspicious",
        36: "timeout",
        24: "timeout",
        -24: "timeout",
        152: "timeout",
        255: "timeout",
        -11: "segfault",
        None: "not checked",
    }.get(code, f"exit {code}")


def scratch_tree(work: Path, modules: list[str]) -> None:
    """The copy mutmut works on: every package, the tests, pyproject.toml, and a
    setup.cfg that names the modules to mutate (the other modules are copied as they
    are) and the tests to run."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache")
    for name in PACKAGES:
        shutil.copytree(ROOT / name, work / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    (work / "tests" / f"{PROFILE}.py").write_text(PROFILE_PLUGIN)
    tests = [t for t in TESTS if (work / t).exists()]
    lines = ["[mutmut]", "source_paths="]
    lines += [f"    {p}" for p in PACKAGES if p != "tests"]
    lines += ["only_mutate="]
    lines += [f"    {DOMAIN}/{m}.py" for m in modules]
    lines += ["pytest_add_cli_args_test_selection="]
    lines += [f"    {t}" for t in tests]
    lines += ["pytest_add_cli_args=", "    -p", "    no:cacheprovider", "    -p"]
    lines += [f"    tests.{PROFILE}"]
    lines += ["use_git_change_detection=false"]
    (work / "setup.cfg").write_text("\n".join(lines) + "\n")


def read_results(work: Path) -> dict[str, str]:
    """mutant name → status, from mutmut's per-file `.meta` records."""
    out: dict[str, str] = {}
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        for name, code in data.get("exit_code_by_key", {}).items():
            out[name] = _status(code)
    return out


def diff_of(work: Path, mutmut: str, name: str) -> str:
    shown = subprocess.run(
        [mutmut, "show", name], cwd=work, capture_output=True, text=True, timeout=120
    )
    return shown.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", default=",".join(MODULES))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=7200.0)
    parser.add_argument("--keep", action="store_true", help="keep the scratch tree")
    args = parser.parse_args()
    modules = [m for m in args.modules.split(",") if m]
    unknown = sorted(set(modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown modules {unknown} (of {', '.join(MODULES)})")
    mutmut = str(Path(sys.executable).parent / "mutmut")
    work = Path(tempfile.mkdtemp(prefix="gpufleet-mutation-"))
    began = time.monotonic()
    try:
        scratch_tree(work, modules)
        env = {**os.environ, "PYTHONPATH": "", "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            run = subprocess.run(
                [mutmut, "run", "--max-children", str(args.jobs)],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=args.timeout,
            )
            finished, tail = run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        except subprocess.TimeoutExpired as exc:
            finished = False
            out = exc.stdout or b""
            tail = (out.decode() if isinstance(out, bytes) else out)[-4000:]
        statuses = read_results(work)
        survivors = sorted(n for n, s in statuses.items() if s == "survived")
        diffs = {n: diff_of(work, mutmut, n) for n in survivors}
    finally:
        if args.keep:
            print(f"scratch tree kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - began
    counts = Counter(statuses.values())
    killed = sum(counts[s] for s in KILLED)
    judged = killed + counts["survived"] + counts["no tests"]
    ratio = killed / judged if judged else 0.0
    per_module: dict[str, Counter[str]] = {}
    for name, status in statuses.items():
        module = name.split(".x_")[0].split(".x\u01c1")[0]
        per_module.setdefault(module, Counter())[status] += 1
    print(f"mutants: {len(statuses)} ({dict(counts)}) in {seconds:.0f} s")
    for module, c in sorted(per_module.items()):
        print(f"  {module}: {dict(c)}")
    print(f"killed {killed}, survived {counts['survived']}, no tests {counts['no tests']}")
    for name in survivors:
        print(f"survived: {name}")
    if not finished:
        print("mutmut did not finish:\n" + tail)
    result: dict[str, Any] = {
        "modules": modules,
        "tests": list(TESTS),
        "seconds": round(seconds, 1),
        "finished": finished,
        "counts": dict(counts),
        "per_module": {m: dict(c) for m, c in per_module.items()},
        "killed": killed,
        "survived": counts["survived"],
        "survivors": diffs,
    }
    goals = [
        Goal(
            f"mutants killed ({', '.join(modules)})",
            f"{killed}/{judged} = {ratio:.1%}",
            "",
            f">= {GOAL_KILLED:.0%}",
            finished and ratio >= GOAL_KILLED,
        )
    ]
    return write("mutation", result, goals)


if __name__ == "__main__":
    sys.exit(main())
