"""NATS's settings are declared once (`procs.nats.NatsSettings`) and nested as `nats` in
every process's settings model, so an operator gives them the same way to each: the
same flags, variables and file keys, a `[nats]` table or the flat names, the same
checks."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from agent.config import Settings as AgentSettings
from coordinator.config import CoordinatorSettings
from ops.cli.settings import CliSettings
from ops.forwarder.settings import ForwarderSettings
from ops.slurm.bridge.settings import BridgeSettings
from procs.nats import NatsSettings, ProbedNatsSettings
from procs.settings import ConfigError, SettingsModel, fields, flag_specs, load, outer_fields
from procs.settings.model import kind_of
from shared.ids import new_pool_id

POOL = new_pool_id()
# What each process needs besides NATS to load at all.
NEEDS: dict[type[SettingsModel], list[str]] = {
    CoordinatorSettings: [],
    AgentSettings: ["--pool-id", POOL],
    ForwarderSettings: ["--webhook", "http://127.0.0.1:9/hook"],
    BridgeSettings: ["--coordinator-key", "k"],
    CliSettings: [],
}
MODELS = list(NEEDS)
# Processes that probe their link (procs.nats_link) have the probe's two settings too.
PROBING = {CoordinatorSettings, ForwarderSettings, BridgeSettings}
# The outside names of every NATS setting: nats_url, …, subject_prefix.
NATS_NAMES = {f.name for f in outer_fields(CoordinatorSettings) if f.path[:1] == ("nats",)}
# A coordinator setting of its subscriptions, not of how it reaches NATS.
OWN_NATS_FIELDS = {"nats_pending_msgs_limit"}


@pytest.mark.parametrize("model", MODELS)
def test_every_process_nests_the_one_nats_settings_and_no_flat_copy(
    model: type[SettingsModel],
) -> None:
    declared = {f.name: kind_of(f.annotation) for f in fields(model)}
    wanted = ProbedNatsSettings if model in PROBING else NatsSettings
    assert declared["nats"] is wanted, model
    flat = {n for n in declared if n in NATS_NAMES or n.startswith("nats_")}
    assert flat <= OWN_NATS_FIELDS, f"{model.__name__} re-declares {flat}"
    assert {"nats_url", "nats_credentials", "subject_prefix"} <= NATS_NAMES


@pytest.mark.parametrize("model", MODELS)
def test_every_process_takes_the_same_nats_flags(model: type[SettingsModel]) -> None:
    flags = {name for spec in flag_specs(model) for name in spec.names}
    same = {"--nats-url", "--nats-credentials", "--nats-tls-ca", "--nats-tls-cert"}
    assert same | {"--nats-tls-key", "--subject-prefix"} <= flags
    assert ("--nats-probe-timeout-s" in flags) == (model in PROBING)


def _load(model: type[SettingsModel], argv: list[str], env: dict[str, str]) -> Any:
    return load(model, [*NEEDS[model], *argv], env)


@pytest.mark.parametrize("model", MODELS)
def test_flags_env_and_both_file_spellings_give_the_same_settings(
    model: type[SettingsModel], tmp_path: Path
) -> None:
    url, prefix = "nats://n1:4222,nats://n2:4222", "gf"
    want = NatsSettings(url=url, subject_prefix=prefix)
    by_flags = _load(model, ["--nats-url", url, "--subject-prefix", prefix], {})
    by_env = _load(model, [], {"GPUFLEET_NATS_URL": url, "GPUFLEET_SUBJECT_PREFIX": prefix})
    table = model.toml_table
    head = f"[{table}]\n" if table else ""
    flat = tmp_path / "flat.toml"
    flat.write_text(f'{head}nats_url = "{url}"\nsubject_prefix = "{prefix}"\n')
    nested = tmp_path / "nested.toml"
    nested_head = f"[{table}.nats]\n" if table else "[nats]\n"
    nested.write_text(f'{nested_head}url = "{url}"\nsubject_prefix = "{prefix}"\n')
    by_flat = _load(model, ["--config", str(flat)], {})
    by_table = _load(model, ["--config", str(nested)], {})
    for got in (by_flags, by_env, by_flat, by_table):
        assert (got.nats.url, got.nats.subject_prefix) == (want.url, want.subject_prefix)
        assert got.nats.servers == ["nats://n1:4222", "nats://n2:4222"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--nats-url", "http://x:1"], "nats_url"),
        (["--nats-credentials", "/nonexistent/agent.creds"], "nats_credentials"),
        (["--nats-tls-ca", "/nonexistent/ca.pem"], "nats_tls_ca"),
        (["--subject-prefix", "a b"], "subject_prefix"),
    ],
)
def test_a_bad_nats_setting_is_refused_by_every_process_naming_it(
    model: type[SettingsModel], argv: list[str], field: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        _load(model, argv, {})
    assert refused.value.field == field


def test_a_certificate_needs_its_key_and_the_client_gets_tls_only_when_asked(
    tmp_path: Path,
) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="nats_tls_key: nats_tls_cert and nats_tls_key go"):
        load(ForwarderSettings, [*NEEDS[ForwarderSettings], "--nats-tls-cert", str(cert)], {})
    creds = tmp_path / "a.creds"
    creds.write_text('user = "u"\npassword = "p"\n')
    options = NatsSettings(credentials=str(creds)).client_options()
    assert options == {"user": "u", "password": "p"}
    bundle = ssl.get_default_verify_paths().cafile
    if bundle is None or not Path(bundle).is_file():
        pytest.skip("no CA bundle on this machine")
    tls = NatsSettings(tls_ca=bundle).client_options()["tls"]
    assert isinstance(tls, ssl.SSLContext) and tls.verify_mode == ssl.CERT_REQUIRED
