"""Both daemons' settings come from one model each: every field has a flag and a line in
the docs, the docs' tables are the models', shared settings share their names, and a
model built in code never reads the process environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import config as agent_config
from agent.config import Settings
from coordinator import config as coordinator_config
from coordinator.config import CoordinatorSettings
from procs.settings import ConfigError, SettingsModel, flag_names, load, outer_fields
from procs.settings.commands import command

DOCS = Path(__file__).resolve().parents[3] / "docs"
MODELS: list[type[SettingsModel]] = [Settings, CoordinatorSettings]


def test_agent_docs_table_is_the_model() -> None:
    text = (DOCS / "agent.md").read_text()
    assert agent_config.DOC_TABLE.apply(text) == text, "run: python -m agent.config docs/agent.md"


def test_operator_docs_table_is_the_model() -> None:
    text = (DOCS / "operator.md").read_text()
    assert coordinator_config.DOC_TABLE.apply(text) == text, (
        "run: python -m coordinator.config docs/operator.md"
    )


def _flags(model: type[SettingsModel]) -> set[str]:
    """The long options the daemon's command line offers."""
    params = command(model).params
    return {o for p in params for o in [*p.opts, *p.secondary_opts] if o.startswith("--")}


@pytest.mark.parametrize("model", MODELS)
def test_every_field_has_a_description_and_its_flag(model: type[SettingsModel]) -> None:
    known = _flags(model)
    for field in outer_fields(model):
        if field.name == "health":  # a table: file and env only
            continue
        assert field.description, field.name
        assert flag_names(field.name, field.option)[0] in known, field.name


@pytest.mark.parametrize("model", MODELS)
def test_help_lists_every_flag_and_a_bad_flag_exits_two(
    model: type[SettingsModel], capsys: pytest.CaptureFixture[str]
) -> None:
    for asked in ("-h", "--help"):
        with pytest.raises(SystemExit) as done:
            load(model, [asked], {})
        assert done.value.code == 0
        shown = capsys.readouterr().out
        assert model.summary in shown
        assert _flags(model) <= set(shown.replace("/", " ").replace(",", " ").split()), shown
    with pytest.raises(SystemExit) as done:
        load(model, ["--no-such-flag"], {})
    assert done.value.code == 2 and "--no-such-flag" in capsys.readouterr().err


def test_documented_notice_flag_exists() -> None:
    """docs/api.md tells operators to set the preemption notice with `--notice-s`."""
    assert "--notice-s" in (DOCS / "api.md").read_text()
    assert load(CoordinatorSettings, ["--notice-s", "30"], {}).notice_s == 30


def test_shared_settings_have_the_same_names_on_both_sides() -> None:
    both = {f.name for f in outer_fields(Settings)} & {
        f.name for f in outer_fields(CoordinatorSettings)
    }
    assert {"nats_url", "nats_credentials", "subject_prefix", "log_level"} <= both
    agent_flags = _flags(Settings)
    coordinator_flags = _flags(CoordinatorSettings)
    for name in both:
        flag = "--" + name.replace("_", "-")
        assert flag in agent_flags and flag in coordinator_flags, name


def test_coordinator_precedence_flags_env_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[coordinator]\nmisses = 4\nnotice-s = 60\nhttp_port = 9000\nstate_dir = 'f'\n")
    env = {"GPUFLEET_CONFIG": str(cfg), "GPUFLEET_MISSES": "5", "STATE_DIRECTORY": "/s:/t"}
    s = load(CoordinatorSettings, ["--misses", "6", "--port", "9001"], env)
    assert (s.misses, s.notice_s, s.http_port, s.state_dir) == (6, 60, 9001, "/s")
    assert s.effective_database_url == "sqlite:////s/gpufleet.db"
    env["GPUFLEET_STATE_DIR"] = "e"
    assert load(CoordinatorSettings, [], env).state_dir == "e"


def test_coordinator_file_without_table(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("notice_s = 5\n")
    assert load(CoordinatorSettings, ["--config", str(cfg)], {}).notice_s == 5


def test_unknown_coordinator_key_names_it(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[coordinator]\nnats_urll = 'x'\n")
    with pytest.raises(ConfigError) as err:
        load(CoordinatorSettings, ["--config", str(cfg)], {})
    assert err.value.field == "nats_urll"


def test_model_built_in_code_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_HTTP_PORT", "1234")
    monkeypatch.setenv("GPUFLEET_NOTICE_S", "1")
    s = CoordinatorSettings()
    assert s.http_port == 8080 and s.notice_s == 120


def test_settings_are_frozen() -> None:
    s = CoordinatorSettings()
    with pytest.raises(AttributeError):
        s.notice_s = 1  # type: ignore[misc]


@pytest.mark.parametrize(("text", "value"), [("yes", True), ("on", True), ("0", False)])
def test_env_booleans_take_the_usual_spellings(text: str, value: bool) -> None:
    assert load(CoordinatorSettings, [], {"GPUFLEET_INSECURE_BUS": text}).insecure_bus is value
    with pytest.raises(ConfigError) as err:
        load(CoordinatorSettings, [], {"GPUFLEET_INSECURE_BUS": "maybe"})
    assert err.value.field == "insecure_bus"
