"""The alert forwarder's files as the gpufleet_coordinator role writes them (Ansible's own
template module, run locally) are what `gpufleet-alerts forward --config` reads: every
role variable arrives, the labels included, and the NATS CA reaches it as it reaches the
coordinator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from ops.forwarder.daemon import AlertForwarder
from ops.forwarder.settings import ForwarderSettings
from ops.kit.nats_users import inbox_prefix
from procs.nats import identity_of, parse_credentials
from procs.settings import from_sources
from tests.unit.ansible.test_lint import ansible_env, tool

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "ansible" / "roles" / "gpufleet_coordinator"


def render(
    tmp_path: Path,
    names: tuple[str, ...] = ("alerts.toml", "alerts.env", "alerts-nats.creds"),
    **overrides: object,
) -> Path:
    """`names` (the forwarder's files by default) rendered into tmp_path/etc with the
    role's defaults and `overrides`."""
    etc = tmp_path / "etc"
    etc.mkdir()
    variables = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables |= {
        "gpufleet_coordinator_config_dir": str(etc),
        "ansible_python_interpreter": sys.executable,
        **overrides,
    }
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    for name in names:
        result = subprocess.run(
            [
                tool("ansible"), "localhost", "-c", "local", "-i", "localhost,",
                "-m", "ansible.builtin.template",
                "-a", f"src={ROLE / 'templates' / name}.j2 dest={etc / name}",
                "-e", f"@{tmp_path / 'vars.json'}",
            ],
            capture_output=True, text=True, timeout=120, check=False,
            env=ansible_env(tmp_path),
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    return etc


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (double quotes unwrapped)."""
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = json.loads(value) if value.startswith('"') else value
    return out


def settings_from(config: Path, env: dict[str, str]) -> ForwarderSettings:
    """As `gpufleet-alerts forward --config CONFIG` reads its settings."""
    return from_sources(ForwarderSettings, {"config": str(config)}, env)


def test_the_forwarder_reads_every_role_variable_from_the_rendered_files(
    tmp_path: Path,
) -> None:
    etc = render(
        tmp_path,
        gpufleet_coordinator_alerts_enabled=True,
        gpufleet_coordinator_nats_url="tls://nats.example.net:4222",
        gpufleet_coordinator_subject_prefix="gf",
        gpufleet_coordinator_alerts_durable="fwd-1",
        gpufleet_coordinator_alerts_alertmanager_urls=["http://am-1:9093", "http://am-2:9093"],
        gpufleet_coordinator_alerts_webhook_urls=["https://hooks.example/a?token=x&y=1"],
        gpufleet_coordinator_alerts_labels={"cluster": "eu-1", "team": "ml infra"},
        gpufleet_coordinator_alerts_nats_password="s3cret",
        gpufleet_coordinator_nats_ca_file="/srv/nats-ca.pem",
    )
    env = env_file(etc / "alerts.env")
    # As the coordinator's unit does, the forwarder's trusts the NATS CA the role installs.
    assert env["SSL_CERT_FILE"] == str(etc / "nats-ca.pem")
    s = settings_from(etc / "alerts.toml", env)
    assert s.nats.url == "tls://nats.example.net:4222"
    assert s.nats.subject_prefix == "gf" and s.durable == "fwd-1"
    assert s.alertmanager == ("http://am-1:9093", "http://am-2:9093")
    assert s.webhooks == ("https://hooks.example/a?token=x&y=1",)
    assert dict(s.labels) == {"cluster": "eu-1", "team": "ml infra"}
    assert s.nats.credentials == str(etc / "alerts-nats.creds")
    AlertForwarder(s)  # reads the credentials file the role wrote


def test_the_forwarders_other_settings_reach_it_through_the_role(tmp_path: Path) -> None:
    """Its resend interval and queue bound (and any other key of `[alerts]`) are set
    with `gpufleet_coordinator_alerts_settings`, labels or not."""
    etc = render(
        tmp_path,
        gpufleet_coordinator_alerts_enabled=True,
        gpufleet_coordinator_alerts_alertmanager_urls=["http://127.0.0.1:9093"],
        gpufleet_coordinator_alerts_settings={"resend_interval_s": 5.0, "max_queue": 50},
        gpufleet_coordinator_alerts_labels={"cluster": "eu-1"},
    )
    s = settings_from(etc / "alerts.toml", env_file(etc / "alerts.env"))
    assert s.resend_interval_s == 5.0 and s.max_queue == 50
    assert dict(s.labels) == {"cluster": "eu-1"}


def test_the_forwarder_connects_as_the_user_that_owns_its_durable(tmp_path: Path) -> None:
    """Its default user was `reader:monitoring`, which may not create a durable consumer:
    it is `forwarder:<durable>` (`gpufleet nats-auth --forwarder <durable>`), with its
    password from the vaulted `gpufleet_nats_passwords`."""
    etc = render(
        tmp_path,
        gpufleet_coordinator_alerts_enabled=True,
        gpufleet_coordinator_alerts_alertmanager_urls=["http://127.0.0.1:9093"],
        gpufleet_coordinator_alerts_durable="fwd-1",
        gpufleet_nats_passwords={"forwarder:fwd-1": "its-own", "reader:monitoring": "not-this"},
    )
    creds = (etc / "alerts-nats.creds").read_text()
    assert parse_credentials(creds) == ("forwarder:fwd-1", "its-own")
    # Its replies under the inbox prefix its NATS permissions allow (issue 32).
    found = identity_of(creds, "alerts-nats.creds", "nats_credentials")
    assert found.inbox_prefix == inbox_prefix("forwarder:fwd-1")


def test_the_role_defaults_render_a_config_without_labels_or_ca(tmp_path: Path) -> None:
    etc = render(
        tmp_path,
        gpufleet_coordinator_alerts_enabled=True,
        gpufleet_coordinator_alerts_alertmanager_urls=["http://127.0.0.1:9093"],
    )
    env = env_file(etc / "alerts.env")
    assert "SSL_CERT_FILE" not in env
    s = settings_from(etc / "alerts.toml", env)
    assert s.alertmanager == ("http://127.0.0.1:9093",) and s.webhooks == ()
    assert dict(s.labels) == {} and s.nats.credentials is None


def test_an_upgrade_restarts_the_forwarder_as_well_as_the_coordinator() -> None:
    """Both run from the one virtualenv: a package upgrade that restarted only the
    coordinator left `gpufleet-alerts` on the old code until someone restarted it."""
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    installs = [t for t in tasks if "ansible.builtin.pip" in t]
    assert installs
    for task in installs:
        notify = task["notify"] if isinstance(task["notify"], list) else [task["notify"]]
        assert {"Restart gpufleet-coordinator", "Restart gpufleet-alerts"} <= set(notify), task
