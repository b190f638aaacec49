"""Settings and URLs for a clustered deployment: NATS seed lists and TLS for the
coordinator, PostgreSQL URLs with several hosts, the alert stream's replica count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.bus.alerts import wanted_replicas
from coordinator.config import CoordinatorSettings
from coordinator.ledger.database import normalize_url
from procs.nats import split_servers
from procs.settings import ConfigError, load

BIN = Path(sys.executable).parent


def test_a_seed_list_is_accepted_in_order() -> None:
    s = load(CoordinatorSettings, ["--nats-url", "nats://a:4222, tls://b:4443,nats://c"], {})
    assert s.nats.servers == ["nats://a:4222", "tls://b:4443", "nats://c"]


@pytest.mark.parametrize(
    "value",
    ["nats://a:4222,", "a:4222", "nats://a:99999", "nats://a:4222,http://b:80", "nats://:4222"],
)
def test_a_bad_seed_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ValueError):
        split_servers(value)
    with pytest.raises(ConfigError, match="nats_url"):
        load(CoordinatorSettings, ["--nats-url", value], {})


def test_the_coordinator_exits_2_on_a_bad_seed_list() -> None:
    out = subprocess.run(
        [str(BIN / "gpufleet-coordinator"), "--nats-url", "nats://a:4222,nats://b:port"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2 and "nats_url" in out.stderr and "b:port" in out.stderr
    assert "Traceback" not in out.stderr


def test_tls_files_must_exist_and_a_certificate_needs_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nats_tls_ca"):
        load(CoordinatorSettings, ["--nats-tls-ca", str(tmp_path / "none.pem")], {})
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="nats_tls_key go together"):
        load(CoordinatorSettings, ["--nats-tls-cert", str(cert)], {})


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@db:5432/g", "postgresql+asyncpg://u@db:5432/g"),
        (
            "postgresql://u:p@db1:5433,db2/g",
            "postgresql+asyncpg://u:p@/g?host=db1:5433&host=db2:5432"
            "&target_session_attrs=read-write",
        ),
        (
            "postgres://db1,db2:6000/g?target_session_attrs=primary&ssl=require",
            "postgresql+asyncpg:///g?target_session_attrs=primary&ssl=require"
            "&host=db1:5432&host=db2:6000",
        ),
        ("sqlite:///x.db", "sqlite+aiosqlite:///x.db"),
    ],
)
def test_postgresql_urls_with_several_hosts_settle_on_the_primary(url: str, expected: str) -> None:
    assert normalize_url(url) == expected


def test_the_stream_keeps_three_copies_on_a_cluster_of_three() -> None:
    assert [wanted_replicas(None, n) for n in (1, 2, 3, 5)] == [1, 1, 3, 3]
    assert wanted_replicas(1, 3) == 1 and wanted_replicas(3, 1) == 3
    with pytest.raises(ConfigError, match="alert_stream_replicas"):
        load(CoordinatorSettings, ["--alert-stream-replicas", "0"], {})
