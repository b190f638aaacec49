"""Settings: file < env < flags, validation naming the field, the CLI's exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ConfigError, load_settings
from agent.inventory import SharingRule
from agent.main import main, settings_from_args
from shared.ids import new_pool_id

POOL = new_pool_id()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load_settings({"pool_id": POOL, "node_id": "n1"}, {})
    assert s.nats_url == "nats://127.0.0.1:4222"
    assert s.subject_prefix == "gpufleet" and s.interval_s == 5.0
    assert s.sysfs_root == Path("/") and s.simulate is None and s.labels == ()


def test_node_id_defaults_to_hostname() -> None:
    import socket

    s = load_settings({"pool_id": POOL}, {})
    assert s.node_id == socket.gethostname()


def test_flags_win_over_env_over_file(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        f'pool_id = "{POOL}"\nnode_id = "file"\ninterval_s = 7\nsubject_prefix = "f"\n'
        '[labels]\nrack = "r-file"\nzone = "z-file"\n',
    )
    env = {
        "GPUFLEET_NODE_ID": "env",
        "GPUFLEET_INTERVAL_S": "3",
        "GPUFLEET_LABELS": "zone=z-env,row=7",
    }
    s = load_settings({"node_id": "flag", "labels": {"row": "8"}}, env, cfg)
    assert s.node_id == "flag"
    assert s.interval_s == 3.0
    assert s.subject_prefix == "f"
    assert dict(s.labels) == {"rack": "r-file", "zone": "z-env", "row": "8"}


def test_sharing_and_health_from_file(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        f'pool_id = "{POOL}"\nnode_id = "n"\n'
        '[[sharing]]\ngpus = [0, "GPU-x"]\nmode = "mps"\nreplicas = 3\n'
        '[[sharing]]\ngpus = "all"\nmode = "timeslice"\nreplicas = 2\n'
        "[health]\nrecover_after_s = 5\nxid_faults = [31]\nxid_ignore = [63]\n",
    )
    s = load_settings({}, {}, cfg)
    assert s.sharing == (
        SharingRule(gpus=("0", "GPU-x"), mode="mps", replicas=3),
        SharingRule(gpus=("all",), mode="timeslice", replicas=2),
    )
    assert s.health.recover_after_s == 5 and s.health.xid_faults == (31,)
    assert s.health.xid_ignore == (63,)


@pytest.mark.parametrize(
    ("flags", "env", "field"),
    [
        ({}, {}, "pool_id"),
        ({"pool_id": "pool_NOPE"}, {}, "pool_id"),
        ({"pool_id": POOL, "node_id": "bad id"}, {}, "node_id"),
        ({"pool_id": POOL, "node_id": "n"}, {"GPUFLEET_INTERVAL_S": "fast"}, "interval_s"),
        ({"pool_id": POOL, "node_id": "n", "interval_s": 0.01}, {}, "interval_s"),
        ({"pool_id": POOL, "node_id": "n", "nats_url": "http://x"}, {}, "nats_url"),
        ({"pool_id": POOL, "node_id": "n", "subject_prefix": "a b"}, {}, "subject_prefix"),
        ({"pool_id": POOL, "node_id": "n", "sysfs_root": "/nonexistent"}, {}, "sysfs_root"),
        ({"pool_id": POOL, "node_id": "n", "nats_creds": "/nonexistent"}, {}, "nats_creds"),
        ({"pool_id": POOL, "node_id": "n", "log_level": "LOUD"}, {}, "log_level"),
        ({"pool_id": POOL, "node_id": "n"}, {"GPUFLEET_SHARING": "all:cuda:2"}, "sharing[0].mode"),
        ({"pool_id": POOL, "node_id": "n"}, {"GPUFLEET_LABELS": "novalue"}, "labels"),
        ({"pool_id": POOL, "node_id": "n", "labels": {"bad key": "v"}}, {}, "labels.bad key"),
    ],
)
def test_bad_values_name_the_field(
    flags: dict[str, object], env: dict[str, str], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(flags, env)
    assert err.value.field == field


def test_unknown_file_key_is_rejected(tmp_path: Path) -> None:
    cfg = write(tmp_path, f'pool_id = "{POOL}"\nintervall_s = 3\n')
    with pytest.raises(ConfigError) as err:
        load_settings({}, {}, cfg)
    assert err.value.field == "intervall_s"


def test_cli_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_NATS_URL", "nats://10.0.0.1:4222")
    argv = ["--pool-id", POOL, "--node-id", "n1", "--simulate", "h100-sxm-8", "--interval", "2"]
    argv += ["--label", "rack=r1", "--label", "zone=z", "--share", "0,1:mps:2", "--provisioning"]
    s = settings_from_args(argv)
    assert s.nats_url == "nats://10.0.0.1:4222"
    assert s.simulate == "h100-sxm-8" and s.interval_s == 2.0 and s.provisioning
    assert dict(s.labels) == {"rack": "r1", "zone": "z"}
    assert s.sharing == (SharingRule(gpus=("0", "1"), mode="mps", replicas=2),)


def test_cli_reads_config_file_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(tmp_path, f'pool_id = "{POOL}"\nnode_id = "from-file"\n')
    monkeypatch.setenv("GPUFLEET_CONFIG", str(cfg))
    assert settings_from_args([]).node_id == "from-file"


def test_main_exits_two_on_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pool-id", "nope", "--node-id", "n"]) == 2
    assert "pool_id" in capsys.readouterr().err


def test_main_exits_two_on_unknown_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pool-id", POOL, "--node-id", "n", "--simulate", "no-such-box"]) == 2
    assert "no-such-box" in capsys.readouterr().err
