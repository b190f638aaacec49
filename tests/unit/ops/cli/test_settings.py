"""`gpufleet`'s own settings come from the daemons' mechanism: a model whose fields are
the CLI's flags and the docs' table, read from the TOML file, then `GPUFLEET_*` env, then
flags, and a bad value exits 2 naming the setting."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from ops.cli import settings as cli_settings
from ops.cli.settings import CliSettings
from ops.main import cli, run
from procs.settings import flag_names, outer_fields

DOCS = Path(__file__).resolve().parents[4] / "docs"
NOBODY = "http://127.0.0.1:9"  # the discard port: refused at once


def test_operator_docs_cli_table_is_the_model() -> None:
    text = (DOCS / "operator.md").read_text()
    assert cli_settings.DOC_TABLE.apply(text) == text, (
        "run: python -m ops.cli.settings docs/operator.md"
    )


def test_every_cli_setting_is_a_gpufleet_flag() -> None:
    """API settings on `gpufleet` itself, NATS ones on `alerts watch`, which uses them."""
    alerts = cli.commands["alerts"]
    assert isinstance(alerts, click.Group)
    commands = {"url": cli, "nats_url": alerts.commands["watch"]}
    for field in outer_fields(CliSettings):
        command = commands["nats_url" if field.name in CliSettings.NATS_FLAGS else "url"]
        given = {name for param in command.params for name in getattr(param, "opts", [])}
        assert field.description, field.name
        assert flag_names(field.name, field.option)[0] in given, field.name
    assert "--config" in {name for param in cli.params for name in getattr(param, "opts", [])}


def reached(capsys: pytest.CaptureFixture[str], argv: list[str], env: dict[str, str]) -> str:
    """The coordinator URL `gpufleet pools` tried, from its one-line error."""
    assert run([*argv, "pools"], {"GPUFLEET_KEY": "gpf_x", **env}) == 1
    err = capsys.readouterr().err
    assert "cannot reach the coordinator at " in err, err
    return err.split("cannot reach the coordinator at ")[1].split("/api/")[0]


def test_flags_win_over_env_over_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GPUFLEET_URL", "GPUFLEET_KEY", "GPUFLEET_CLI_CONFIG", "GPUFLEET_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    cfg = tmp_path / "cli.toml"
    cfg.write_text(f'[cli]\nurl = "{NOBODY}/file"\ntimeout_s = 5\n')
    file_only = {"GPUFLEET_CLI_CONFIG": str(cfg)}
    assert reached(capsys, [], file_only) == f"{NOBODY}/file"
    with_env = {**file_only, "GPUFLEET_URL": f"{NOBODY}/env"}
    assert reached(capsys, [], with_env) == f"{NOBODY}/env"
    assert reached(capsys, ["--url", f"{NOBODY}/flag"], with_env) == f"{NOBODY}/flag"
    assert reached(capsys, ["--config", str(cfg)], {}) == f"{NOBODY}/file"


def test_a_bad_setting_exits_two_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUFLEET_TIMEOUT_S", raising=False)
    assert run(["--timeout", "-1", "pools"], {}) == 2
    assert "timeout_s" in capsys.readouterr().err
    assert run(["pools"], {"GPUFLEET_TIMEOUT_S": "soon"}) == 2
    assert "timeout_s" in capsys.readouterr().err
    cfg = tmp_path / "cli.toml"
    cfg.write_text("[cli]\nurll = 'x'\n")
    assert run(["--config", str(cfg), "pools"], {}) == 2
    assert "urll" in capsys.readouterr().err
