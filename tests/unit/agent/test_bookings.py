"""The agent's side of the node's bookings: `BookingsKeeper` keeps the latest valid
message for its own node (others ignored and counted), echoes its etag, and writes the
state file atomically, stamping it when a heartbeat echoed its etag; `gpufleet-agent
bookings` / `env` read that file and trust it only when it is this node's and fresh
(the commands as a user runs them are in tests/e2e/test_agent_bookings.py)."""

from __future__ import annotations

import json
import os
import shlex
import stat
import time
from pathlib import Path

import msgspec
import pytest

from agent.bookings import BookingsError, BookingsKeeper, read_held, read_state
from agent.bookings_command import env_lines, main, state_at
from agent.bookings_trust import (
    ForeignStateFile,
    Held,
    StaleStateFile,
    default_max_age_ms,
    trust,
)
from agent.config import Settings
from agent.errors import CONFIG, NOT_LIVE
from shared.clock import FakeClock
from shared.wire import BookedDevice, NodeBooking, NodeBookings

NOW = int(time.time() * 1000)
HOUR = 3_600_000


def dev(cls: str, device: str, pci: str | None = None) -> BookedDevice:
    return BookedDevice(atom_id=f"n0:{cls}:{pci or device}", cls=cls, device_id=device,  # type: ignore[arg-type]
                        pci_address=pci)  # fmt: skip


LIVE = NodeBooking(
    reservation_id="rsv_live", tenant_id="acme", state="active", start=NOW - HOUR,
    end=NOW + HOUR,
    devices=(
        dev("gpu", "GPU-a"), dev("gpu.mig", "MIG-1"), dev("gpu.slot", "GPU-s"),
        dev("gpu.slot", "GPU-s"), dev("nic.vf", "0000:1a:00.0", "0000:1a:00.2"),
        dev("nic.vf", "0000:1a:00.0", "0000:1a:00.3"), dev("disk", "wwn-1"),
    ),
)  # fmt: skip
LATER = NodeBooking(reservation_id="rsv_later", tenant_id="acme", state="scheduled",
                    start=NOW + HOUR, end=NOW + 2 * HOUR,
                    devices=(dev("gpu", "GPU-b"),))  # fmt: skip
ENDED = NodeBooking(reservation_id="rsv_ended", tenant_id="acme", state="active",
                    start=NOW - 2 * HOUR, end=NOW - HOUR,
                    devices=(dev("gpu", "GPU-c"),))  # fmt: skip
HELD = NodeBookings(node_id="n0", etag="e1", sent_at=NOW, bookings=(LIVE, LATER, ENDED))


def test_the_keeper_keeps_its_own_nodes_latest_and_writes_it_atomically(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o750)
    path = tmp_path / "state" / "bookings.json"
    seen: list[str] = []
    keeper = BookingsKeeper("n0", path, on_change=lambda b: seen.append(b.etag))
    assert keeper.etag == ""  # nothing yet: the coordinator sends them
    keeper.on_message(HELD.to_json())
    assert keeper.etag == "e1" and seen == ["e1"]
    assert read_state(path) == HELD and path.read_bytes() == HELD.to_json()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # as its directory: launchers' group
    os.chmod(path.parent, 0o700)
    keeper.on_message(msgspec.structs.replace(HELD, etag="e0").to_json())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    keeper.on_message(HELD.to_json())
    assert os.listdir(path.parent) == ["bookings.json"]  # no temporary file left behind

    # Another node's, or what is not bookings at all: ignored, counted, nothing changes.
    keeper.on_message(NodeBookings(node_id="n1", etag="e9", sent_at=NOW).to_json())
    keeper.on_message(b"{not json")
    keeper.on_message(b'{"nodeId": "n0", "etag": 5, "sentAt": 0}')
    assert keeper.ignored == {"wrong_node": 1, "bad_schema": 2}
    assert keeper.etag == "e1" and read_state(path) == HELD and seen == ["e1", "e0", "e1"]

    # The same etag again (a re-send) rewrites nothing; a new one replaces the file.
    before = path.stat().st_ino
    keeper.on_message(HELD.to_json())
    assert path.stat().st_ino == before and seen == ["e1", "e0", "e1"]
    empty = NodeBookings(node_id="n0", etag="e2", sent_at=NOW)
    keeper.on_message(empty.to_json())
    assert read_state(path) == empty and keeper.etag == "e2" and seen[-1] == "e2"


def test_the_holders_of_each_unit_are_the_bookings_live_now() -> None:
    keeper = BookingsKeeper("n0", None)
    assert keeper.holders(NOW) == {}
    keeper.on_message(HELD.to_json())
    held = keeper.holders(NOW)
    assert held["GPU-a"] == held["MIG-1"] == held["GPU-s"] == frozenset({"rsv_live"})
    assert "GPU-b" not in held and "GPU-c" not in held  # not started, ended
    assert keeper.holders(NOW + HOUR)["GPU-b"] == frozenset({"rsv_later"})


def test_a_state_file_that_cannot_be_written_is_counted_and_the_etag_still_echoed(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "d" / "bookings.json"
    blocked.mkdir(parents=True)  # a directory where the file goes: the rename fails
    keeper = BookingsKeeper("n0", blocked)
    keeper.on_message(HELD.to_json())
    assert keeper.write_failures == 1 and keeper.etag == "e1"
    assert os.listdir(blocked.parent) == ["bookings.json"]  # its temporary file removed
    # A state directory that does not exist is not made: the host's /var/lib is left
    # alone by an agent run by hand; the etag is still echoed.
    keeper = BookingsKeeper("n0", tmp_path / "none" / "bookings.json")
    keeper.on_message(HELD.to_json())
    assert not (tmp_path / "none").exists() and keeper.etag == "e1"
    assert keeper.write_failures == 0


def test_read_state_says_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(BookingsError, match="has not received"):
        read_state(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(BookingsError, match="does not hold bookings"):
        read_state(tmp_path / "bad.json")


def test_env_prints_exactly_the_reservations_devices() -> None:
    lines = env_lines(HELD, "rsv_live", NOW)
    values = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines)
    assert values == {
        # GPU and MIG UUIDs in the order given (device index order); a GPU's slots once.
        "CUDA_VISIBLE_DEVICES": "GPU-a,MIG-1,GPU-s",
        "NVIDIA_VISIBLE_DEVICES": "GPU-a,MIG-1,GPU-s",
        "GPUFLEET_RESERVATION_ID": "rsv_live",
        "GPUFLEET_NIC_VFS": "0000:1a:00.2,0000:1a:00.3",
        "GPUFLEET_DISKS": "wwn-1",
    }
    assert all(line.startswith("export ") for line in lines)


@pytest.mark.parametrize(
    ("rid", "message"),
    [
        ("rsv_later", "is not live on node n0 yet: it starts at"),
        ("rsv_ended", "is not live on node n0: it ended at"),
        ("rsv_other", "has no booking on node n0"),
    ],
)
def test_env_refuses_a_reservation_not_live_here(rid: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        env_lines(HELD, rid, NOW)


def test_states_follow_this_hosts_clock() -> None:
    assert [state_at(b, NOW) for b in HELD.bookings] == ["active", "scheduled", "ended"]
    assert state_at(LATER, LATER.start) == "active"  # started since the file was written


def test_the_commands_exit_codes_and_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bookings.json"
    path.write_bytes(HELD.to_json())
    flags = ["--bookings-file", str(path), "--node-id", "n0"]
    assert main(["env", "rsv_live", *flags], {}) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[2] == "export GPUFLEET_RESERVATION_ID=rsv_live" and err == ""
    assert main(["env", "rsv_later", *flags], {}) == NOT_LIVE
    out, err = capsys.readouterr()
    assert out == "" and "not live on node n0 yet" in err
    assert main(["bookings", *flags], {}) == 0
    table = capsys.readouterr().out
    assert (
        "rsv_later    acme    scheduled" in table
        and "1 gpu, 1 gpu.mig, 2 gpu.slot, 2 nic.vf, 1 disk" in table
    )
    assert main(["bookings", "--json", *flags], {}) == 0
    assert '"reservationId": "rsv_live"' in capsys.readouterr().out
    # The state dir names the file too; a missing one, or no RSV_ID, is exit 2.
    assert main(["env", "rsv_live", "--state-dir", str(tmp_path / "none")], {}) == 2
    assert "has not received" in capsys.readouterr().err
    assert main(["env", *flags], {}) == 2
    assert "usage" in capsys.readouterr().err


def test_the_age_and_identity_rules(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "bookings.json"
    held = Held(path, HELD, checked_at=clock.now_ms())
    # Three missed heartbeats (the coordinator's window) and one re-send period.
    assert default_max_age_ms(5.0, 3) == 20_000 and default_max_age_ms(1.0, 3) == 8_000
    assert Settings(pool_id="pool_x", node_id="n0").bookings_max_age_ms == 20_000
    assert Settings(pool_id="pool_x", bookings_max_age_s=90).bookings_max_age_ms == 90_000
    trust(held, "n0", clock.now_ms(), 20_000)
    clock.advance(20_000)
    trust(held, "n0", clock.now_ms(), 20_000)  # the limit itself is allowed
    clock.advance(1)
    with pytest.raises(
        StaleStateFile, match=r"confirmed by the agent 20\.0 s ago.*the 20\.0 s"
    ) as e:
        trust(held, "n0", clock.now_ms(), 20_000)
    assert e.value.status == NOT_LIVE and str(path) in str(e.value)
    trust(held, "n0", clock.now_ms(), 60_000)  # what --max-age allows
    clock.advance(3 * HOUR)
    with pytest.raises(StaleStateFile, match="3 h 0 min ago"):
        trust(held, "n0", clock.now_ms(), 20_000)
    # Another node's file is refused whatever its age, naming both nodes.
    foreign = "bookings of node n0, and this host is node n1"
    with pytest.raises(ForeignStateFile, match=foreign) as f:
        trust(Held(path, HELD, clock.now_ms()), "n1", clock.now_ms(), 20_000)
    assert f.value.status == CONFIG
    # A clock stepped back since the file was stamped: fresh, not a negative age.
    assert Held(path, HELD, clock.now_ms() + 5000).age_ms(clock.now_ms()) == 0


def test_the_file_is_stamped_when_received_and_when_a_heartbeat_echoed_it(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    path = tmp_path / "bookings.json"
    keeper = BookingsKeeper("n0", path, clock=clock)
    keeper.on_message(HELD.to_json())
    assert read_held(path).checked_at == clock.now_ms()
    written = clock.now_ms()
    clock.advance(7000)
    keeper.confirm("e0")  # a heartbeat that echoed another etag confirms nothing
    keeper.confirm("")
    assert read_held(path).checked_at == written
    keeper.confirm("e1")
    assert read_held(path).checked_at == clock.now_ms()
    assert path.read_bytes() == HELD.to_json()  # the content is the message, untouched

    # A restarted agent holds nothing yet: the last run's file is not its to confirm,
    # even with the same etag, until the coordinator has told it again.
    clock.advance(60_000)
    again = BookingsKeeper("n0", path, clock=clock)
    again.confirm("e1")
    assert read_held(path).checked_at == clock.now_ms() - 60_000
    again.on_message(HELD.to_json())
    assert read_held(path).checked_at == clock.now_ms()
    # A file it could not write is not confirmed either.
    blocked = BookingsKeeper("n0", tmp_path / "d" / "bookings.json", clock=clock)
    (tmp_path / "d" / "bookings.json").mkdir(parents=True)
    blocked.on_message(HELD.to_json())
    blocked.confirm("e1")
    assert blocked.write_failures == 1


def test_the_commands_read_the_daemons_config_for_the_node_and_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bookings.json"
    path.write_bytes(HELD.to_json())
    toml = tmp_path / "agent.toml"
    toml.write_text(f'node_id = "n0"\nbookings_file = "{path}"\n')
    assert main(["env", "rsv_live"], {}, default_config=toml) == 0
    assert "GPUFLEET_RESERVATION_ID=rsv_live" in capsys.readouterr().out
    # The file of another node: refused, both named, nothing on stdout.
    toml.write_text(f'node_id = "n1"\nbookings_file = "{path}"\n')
    assert main(["env", "rsv_live"], {}, default_config=toml) == CONFIG
    out, err = capsys.readouterr()
    assert out == "" and "bookings of node n0, and this host is node n1" in err
    assert main(["bookings"], {}, default_config=toml) == CONFIG
    # An old file: env refuses it (exit 3) unless --max-age allows it; bookings shows it.
    old = time.time() - 3600
    os.utime(path, (old, old))
    flags = ["--bookings-file", str(path), "--node-id", "n0"]
    assert main(["env", "rsv_live", *flags], {}, default_config=toml) == NOT_LIVE
    out, err = capsys.readouterr()
    assert out == "" and "last confirmed by the agent 1 h 0 min ago" in err and "20.0 s" in err
    assert main(["env", "rsv_live", *flags, "--max-age", "7200"], {}) == 0
    capsys.readouterr()
    assert main(["bookings", *flags], {}) == 0
    out, err = capsys.readouterr()
    assert "confirmed 1 h 0 min ago (max 20.0 s)" in out.splitlines()[0]
    assert "warning: the bookings in" in err
    assert main(["bookings", "--json", *flags, "--max-age", "5000"], {}) == 0
    body = json.loads(capsys.readouterr().out)
    assert 3_600_000 <= body["ageMs"] < 3_660_000 and body["maxAgeMs"] == 5_000_000
    assert body["checkedAt"] == int(old * 1000) and body["etag"] == "e1"
