"""ops has one exception root: every exception a tool declares is an `OpsError`, which
`ops.main.run` turns into one line on stderr and its exit status in one place (a bad
flag value stays click's usage error, exit 2 with its hint)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import click
import pytest

import ops
from ops.kit.errors import OpsError
from ops.kit.nats_users import NatsAuthError
from ops.main import run


def _declared() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(ops.__path__, "ops."):
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == info.name:
                found.append(value)
    return found


def test_every_exception_ops_declares_has_the_one_root() -> None:
    declared = _declared()
    assert len(declared) >= 8  # the walk found the tools' errors
    usage = (click.UsageError, click.BadParameter)
    wrong = [e for e in declared if not issubclass(e, OpsError) and not issubclass(e, usage)]
    assert wrong == []


def test_a_tools_error_is_one_line_and_its_exit_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # nats-auth: bad input is exit 2, said by the tool's own name.
    assert NatsAuthError.exit_code == 2
    assert run(["nats-auth", "--out", "/nonexistent/x", "--tls-cert", "c"]) == 2
    err = capsys.readouterr().err
    assert err == "gpufleet nats-auth: --tls-cert and --tls-key go together\n"
    # The API client: nothing listening is exit 1, naming the URL.
    assert run(["--url", "http://127.0.0.1:9", "pools"], {"GPUFLEET_KEY": "gpf_x"}) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpufleet: cannot reach the coordinator at http://127.0.0.1:9/")
    assert err.count("\n") == 1
