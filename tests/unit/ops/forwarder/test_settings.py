"""The alert forwarder's settings come from the daemons' mechanism: the `[alerts]` table
of its TOML file, then `GPUFLEET_*` env (the URL lists under the names the Ansible role
writes), then flags; a bad value, or no target, exits 2 naming the setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ops.forwarder import settings as forwarder_settings
from ops.forwarder.settings import ForwarderSettings
from procs.settings import ConfigError, from_sources

DOCS = Path(__file__).resolve().parents[4] / "docs"
BIN = Path(sys.executable).parent
AM = "http://127.0.0.1:9"  # the discard port: nothing is sent in these tests


def test_operator_docs_forwarder_table_is_the_model() -> None:
    text = (DOCS / "operator.md").read_text()
    assert forwarder_settings.DOC_TABLE.apply(text) == text, (
        "run: python -m ops.forwarder.settings docs/operator.md"
    )


def test_flags_win_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "alerts.toml"
    cfg.write_text(
        f'[alerts]\nalertmanager = ["{AM}/file"]\ndurable = "from-file"\nmax_queue = 7\n'
        '[alerts.labels]\ncluster = "eu-1"\n'
    )
    file_only = from_sources(ForwarderSettings, {}, {"GPUFLEET_ALERTS_CONFIG": str(cfg)})
    assert file_only.alertmanager == (f"{AM}/file",) and file_only.durable == "from-file"
    assert file_only.max_queue == 7 and dict(file_only.labels) == {"cluster": "eu-1"}
    env = {
        "GPUFLEET_ALERTS_CONFIG": str(cfg),
        "GPUFLEET_ALERTMANAGER_URLS": f"{AM}/a, {AM}/b",
        "GPUFLEET_ALERT_WEBHOOKS": "https://hooks.example/x?token=t",
        "GPUFLEET_DURABLE": "from-env",
    }
    from_env = from_sources(ForwarderSettings, {}, env)
    assert from_env.alertmanager == (f"{AM}/a", f"{AM}/b")
    assert from_env.webhooks == ("https://hooks.example/x?token=t",)
    assert from_env.durable == "from-env" and from_env.max_queue == 7
    flags = {"alertmanager": (f"{AM}/flag",), "durable": "from-flag"}
    from_flags = from_sources(ForwarderSettings, flags, env)
    assert from_flags.alertmanager == (f"{AM}/flag",) and from_flags.durable == "from-flag"


@pytest.mark.parametrize(
    ("flags", "env", "field"),
    [
        ({"max_queue": "0"}, {}, "max_queue"),
        ({}, {"GPUFLEET_BATCH": "many"}, "batch"),
        ({"alertmanager": ("ftp://am",)}, {}, "alertmanager"),
        ({}, {"GPUFLEET_ALERT_WEBHOOKS": "hooks.example/x"}, "webhooks"),
        ({"backoff_initial_s": "9", "backoff_max_s": "1"}, {}, "backoff_initial_s"),
        ({"nats_url": "nats://a:1,b:port"}, {}, "nats_url"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field(
    flags: dict[str, object], env: dict[str, str], field: str
) -> None:
    with pytest.raises(ConfigError) as bad:
        from_sources(ForwarderSettings, {"alertmanager": (AM,), **flags}, env)
    assert bad.value.field == field


def test_no_target_is_refused() -> None:
    with pytest.raises(ConfigError) as bad:
        from_sources(ForwarderSettings, {}, {})
    assert bad.value.field == "alertmanager" and "no target" in str(bad.value)


def forward(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "gpufleet-alerts"), "forward", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"} | (env or {}),
    )


def test_forwarder_configuration_errors_exit_two_naming_the_field(tmp_path: Path) -> None:
    out = forward("--alertmanager", AM, "--max-queue", "0")
    assert out.returncode == 2 and "max_queue" in out.stderr, out.stderr
    out = forward(env={"GPUFLEET_ALERTMANAGER_URLS": AM, "GPUFLEET_HTTP_TIMEOUT_S": "soon"})
    assert out.returncode == 2 and "http_timeout_s" in out.stderr, out.stderr
    out = forward()
    assert out.returncode == 2 and "no target" in out.stderr, out.stderr
    bad = tmp_path / "alerts.toml"
    bad.write_text(f'[alerts]\nalertmanager = ["{AM}"]\nresend_interval_s = -1\n')
    out = forward("--config", str(bad))
    assert out.returncode == 2 and "resend_interval_s" in out.stderr, out.stderr
    bad.write_text(f'[alerts]\nalertmanager = ["{AM}"]\ncondition_ttl_s = 60\n')
    out = forward("--config", str(bad))
    assert out.returncode == 2 and "condition_ttl_s" in out.stderr, out.stderr
    bad.write_text("not = [toml")
    out = forward("--config", str(bad))
    assert out.returncode == 2 and "not valid TOML" in out.stderr, out.stderr
    # A URL's password never reaches the terminal, even in a refused value.
    out = forward("--alertmanager", "ftp://user:s3cret@am")
    assert out.returncode == 2 and "alertmanager" in out.stderr and "s3cret" not in out.stderr


def test_help_lists_the_settings() -> None:
    out = subprocess.run(
        [str(BIN / "gpufleet-alerts"), "forward", "-h"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for flag in ("--config", "--alertmanager", "--webhook", "--durable", "--max-queue"):
        assert flag in out.stdout, flag
    assert "GPUFLEET_ALERTMANAGER_URLS" in out.stdout
