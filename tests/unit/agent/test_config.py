"""Agent settings: file < env < flags, validation naming the field, the CLI's exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import Settings
from agent.inventory import SharingRule
from agent.main import main
from procs.settings import ConfigError, load
from shared.ids import new_pool_id

POOL = new_pool_id()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load(Settings, ["--pool-id", POOL, "--node-id", "n1"], {})
    assert s.nats.url == "nats://127.0.0.1:4222"
    assert s.nats.subject_prefix == "gpufleet" and s.interval_s == 5.0
    assert s.sysfs_root == Path("/") and s.simulate is None and s.label_pairs == ()


def test_node_id_defaults_to_hostname() -> None:
    import socket

    s = load(Settings, ["--pool-id", POOL], {})
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
        "GPUFLEET_HEALTH__XID_HOLD_S": "9",
    }
    s = load(Settings, ["--config", str(cfg), "--node-id", "flag", "--label", "row=8"], env)
    assert s.node_id == "flag"
    assert s.interval_s == 3.0
    assert s.nats.subject_prefix == "f"
    assert s.labels == {"rack": "r-file", "zone": "z-env", "row": "8"}
    assert s.health.xid_hold_s == 9


def test_sharing_and_health_from_file(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        f'pool_id = "{POOL}"\nnode_id = "n"\n'
        '[[sharing]]\ngpus = [0, "GPU-x"]\nmode = "mps"\nreplicas = 3\n'
        '[[sharing]]\ngpus = "all"\nmode = "timeslice"\nreplicas = 2\n'
        "[health]\nrecover_after_s = 5\nxid_faults = [31]\nxid_ignore = [63]\n",
    )
    s = load(Settings, ["--config", str(cfg)], {})
    assert s.sharing_rules == (
        SharingRule(gpus=("0", "GPU-x"), mode="mps", replicas=3),
        SharingRule(gpus=("all",), mode="timeslice", replicas=2),
    )
    assert s.health.recover_after_s == 5 and s.health.xid_faults == (31,)
    assert s.health.xid_ignore == (63,)


BASE = ["--pool-id", POOL, "--node-id", "n"]


@pytest.mark.parametrize(
    ("argv", "env", "field"),
    [
        ([], {}, "pool_id"),
        (["--pool-id", "pool_NOPE"], {}, "pool_id"),
        (["--pool-id", POOL, "--node-id", "bad id"], {}, "node_id"),
        (BASE, {"GPUFLEET_INTERVAL_S": "fast"}, "interval_s"),
        ([*BASE, "--interval", "0.01"], {}, "interval_s"),
        ([*BASE, "--nats-url", "http://x"], {}, "nats_url"),
        ([*BASE, "--subject-prefix", "a b"], {}, "subject_prefix"),
        ([*BASE, "--sysfs-root", "/nonexistent"], {}, "sysfs_root"),
        ([*BASE, "--nats-credentials", "/nonexistent"], {}, "nats_credentials"),
        (BASE, {"GPUFLEET_NATS_CREDS": "/nonexistent"}, "nats_credentials"),
        (BASE, {"GPUFLEET_LOG_LEVEL": "LOUD"}, "log_level"),
        (BASE, {"GPUFLEET_SHARING": "all:cuda:2"}, "sharing[0].mode"),
        ([*BASE, "--share", "0:mps"], {}, "sharing"),
        (BASE, {"GPUFLEET_LABELS": "novalue"}, "labels"),
        ([*BASE, "--label", "bad key=v"], {}, "labels.bad key"),
        (BASE, {"GPUFLEET_HEALTH": "{not json"}, "health"),
        (BASE, {"GPUFLEET_HEALTH__XID_FAULTS": "[-1]"}, "health.xid_faults[0]"),
        ([*BASE, "--expect", "gpu"], {}, "expected"),
        ([*BASE, "--expect", "gpu=-1"], {}, "expected.gpu"),
    ],
)
def test_bad_values_name_the_field(argv: list[str], env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(Settings, argv, env)
    assert err.value.field == field


def test_device_truth_settings_from_file_and_flags(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        f'pool_id = "{POOL}"\nnode_id = "n1"\noffer_boot_disks = true\n'
        "[expected]\ngpu = 8\ndisk = 2\n",
    )
    argv = ["--config", str(cfg), "--management-nic", "eno1", "--management-nic", "eno2"]
    s = load(Settings, argv, {})
    assert dict(s.expected) == {"gpu": 8, "disk": 2}
    assert s.offer_boot_disks and not s.offer_management_nics
    assert s.management_nics == ("eno1", "eno2") and s.release_file is None
    with pytest.raises(ConfigError) as err:
        load(Settings, [*BASE, "--expect", "node=1"], {})
    assert err.value.field.startswith("expected")


def test_unknown_file_key_is_rejected(tmp_path: Path) -> None:
    cfg = write(tmp_path, f'pool_id = "{POOL}"\nintervall_s = 3\n')
    with pytest.raises(ConfigError) as err:
        load(Settings, ["--config", str(cfg)], {})
    assert err.value.field == "intervall_s"


def test_old_credentials_name_still_works(tmp_path: Path) -> None:
    creds = tmp_path / "agent.creds"
    creds.write_text('user = "u"\npassword = "p"\n')
    cfg = write(tmp_path, f'pool_id = "{POOL}"\nnats_creds = "{creds}"\n')
    assert load(Settings, ["--config", str(cfg)], {}).nats.credentials == str(creds)
    assert load(Settings, [*BASE, "--nats-creds", str(creds)], {}).nats.credentials == str(creds)


def test_cli_flags() -> None:
    env = {"GPUFLEET_NATS_URL": "nats://10.0.0.1:4222"}
    argv = [*BASE, "--simulate", "h100-sxm-8", "--interval", "2", "--log-level", "debug"]
    argv += ["--label", "rack=r1", "--label", "zone=z", "--share", "0,1:mps:2", "--provisioning"]
    s = load(Settings, argv, env)
    assert s.nats.url == "nats://10.0.0.1:4222" and s.log_level == "DEBUG"
    assert s.simulate == "h100-sxm-8" and s.interval_s == 2.0 and s.provisioning
    assert s.labels == {"rack": "r1", "zone": "z"}
    assert s.sharing_rules == (SharingRule(gpus=("0", "1"), mode="mps", replicas=2),)


def test_bad_flag_exits_two() -> None:
    with pytest.raises(SystemExit) as exit_:
        load(Settings, [*BASE, "--log-level", "LOUD"], {})
    assert exit_.value.code == 2


def test_cli_reads_config_file_from_env(tmp_path: Path) -> None:
    cfg = write(tmp_path, f'pool_id = "{POOL}"\nnode_id = "from-file"\n')
    assert load(Settings, [], {"GPUFLEET_CONFIG": str(cfg)}).node_id == "from-file"


def test_main_exits_two_on_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pool-id", "nope", "--node-id", "n"]) == 2
    assert "pool_id" in capsys.readouterr().err


def test_main_exits_two_on_unknown_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pool-id", POOL, "--node-id", "n", "--simulate", "no-such-box"]) == 2
    assert "no-such-box" in capsys.readouterr().err


def test_env_names_json_tables_and_nested_keys() -> None:
    """The env rules pydantic-settings had, now `procs.settings.from_env`'s own: names
    are case-insensitive, empty values are unset, a table is JSON with `__` keys merged
    over it, a list field's text form stands alone."""
    env = {
        "gpufleet_pool_id": POOL,
        "GPUFLEET_NODE_ID": "",
        "GPUFLEET_HEALTH": '{"xid_hold_s": 5, "recover_after_s": 3}',
        "GPUFLEET_Health__Xid_Hold_S": "7",
        "GPUFLEET_HEALTH__XID_FAULTS": "[1, 2]",
        "GPUFLEET_MANAGEMENT_NICS": "eth0,eth1",
        "GPUFLEET_EXPECTED__GPU": "8",
    }
    s = load(Settings, [], env, defaults={"node_id": "default"})
    assert s.pool_id == POOL
    assert s.node_id == "default"
    assert (s.health.xid_hold_s, s.health.recover_after_s) == (7, 3)
    assert s.health.xid_faults == (1, 2)
    assert s.management_nics == ("eth0", "eth1")
    assert s.expected == {"gpu": 8}
    with pytest.raises(ConfigError) as err:
        load(Settings, [], {**env, "GPUFLEET_HEALTH__XID_FAULTS": "{bad"})
    assert err.value.field == "health"


def test_a_bad_table_key_says_what_is_wrong_with_it() -> None:
    # The error names the key and carries msgspec's reason, not the path text.
    with pytest.raises(ConfigError) as err:
        load(Settings, [*BASE, "--label", "bad key=v"], {})
    assert err.value.field == "labels.bad key"
    assert "settings" not in str(err.value)
    assert "match" in str(err.value) or "pattern" in str(err.value)
