"""`gpufleet` as a user runs it: the real command in a subprocess against a running
coordinator (and its agent and NATS), piped and on a terminal (a pty), checking tables,
JSON, CSV, one-line answers and one-line errors; the coordinator's access and audit
lines; `gpufleet-agent inventory`."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.e2e.cli_world import (
    BIN,
    World,
    json_of,
    on_terminal,
    piped,
    running_fleet,
    terminal_bytes,
    two_tenants,
)
from tests.e2e.fleet_procs import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("cli")
    with running_fleet(tmp, "--log-format", "json") as (fleet, nats_url):
        pools = two_tenants(fleet)
        fleet.start_agent("h100-a", pools.h100, "h100-sxm-8", 1.0)

        def gpus() -> int:
            where = {"tenantId": "acme", "poolId": pools.h100}
            rows = pools.op.call("capacity.byPool", where)["rows"]
            return int(next(r for r in rows if r["resource"] == "gpu")["allocatable"])

        wait_for(lambda: gpus() == 8, what="8 allocatable GPUs")
        yield pools.booked(fleet, nats_url, tmp, "cli-1")


def test_views_are_json_when_piped_and_tables_on_a_terminal(world: World) -> None:
    rid = world.reservation
    views: list[tuple[list[str], str, Any]] = [
        (["pools"], "POOL", lambda d: {p["name"] for p in d} == {"h100-east", "mixed"}),
        (["nodes"], "LAST SEEN", lambda d: [n["nodeId"] for n in d] == ["h100-a"]),
        (["nodes", "--pool", world.mixed], "no nodes", lambda d: d == []),
        # Pools by name as well as by id (tables show the name first).
        (["nodes", "--pool", "h100-east"], "LAST SEEN", lambda d: len(d) == 1),
        (["reservations", "--pool", "mixed"], "no reservations", lambda d: d == []),
        (["usage", "--pool", "mixed"], "nothing ran", lambda d: d["rows"] == []),
        (["node", "h100-a"], "BUCKET", lambda d: len(d["atoms"]) > 8),
        (["reservations"], "RESERVATION", lambda d: [r["reservationId"] for r in d] == [rid]),
        (["reservations", "--state", "released"], "no reservations", lambda d: d == []),
        (["reservation", rid, "-t", "acme"], "ATOMS", lambda d: d["state"] == "active"),
        (["reservation", rid], "ATOMS", lambda d: d["tenantId"] == "acme"),  # operator: any
        (["tenants"], "KEYS", lambda d: {"acme", "globex"} <= {t["tenantId"] for t in d}),
        (["keys", "acme"], "LABEL", lambda d: [k["label"] for k in d] == ["ci"]),
        (["usage"], "TOTAL HOURS", lambda d: {r["tenantId"] for r in d["rows"]} <= {"acme"}),
        (["summary"], "whole GPUs by model", lambda d: "H100" in d["byGpuModel"]),
    ]  # fmt: skip
    for args, header, check in views:
        ran = piped(world, *args)
        assert ran.code == 0, (args, ran.err)
        data = json.loads(ran.out)
        assert check(data), (args, data)
        # Times are RFC 3339, never epoch milliseconds.
        assert not re.search(r'"(createdAt|start|end|lastSeen)": \d', ran.out), args
        shown = on_terminal(world, *args)
        assert shown.code == 0 and header in shown.out, (args, shown.out)
        assert not shown.out.lstrip().startswith(("{", "[")), (args, shown.out)
    node = on_terminal(world, "node", "h100-a").out
    held = [line for line in node.splitlines() if world.reservation in line]
    assert len(held) == 2 and all("allocatable" in line for line in held), node
    wide = on_terminal(world, "nodes", "-o", "wide").out
    assert "HOSTNAME" in wide and "HOSTNAME" not in on_terminal(world, "nodes").out
    # --local: the machine's zone (POSIX TZ, five and a half hours east), else UTC.
    args = ("-o", "json", "reservation", world.reservation, "-t", "acme")
    local = piped(world, "--local", *args, env={"TZ": "XST-5:30"})
    assert re.search(r'"start": "\d{4}-\d\d-\d\dT[\d:.]+\+05:30"', local.out), local.out
    utc = piped(world, *args, env={"TZ": "XST-5:30"})
    assert re.search(r'"start": "\d{4}-\d\d-\d\dT[\d:.]+Z"', utc.out), utc.out


def test_a_tenant_key_acts_for_its_tenant_without_naming_it(world: World) -> None:
    acme = json_of(world, "reservations", key=world.acme_key)
    assert [r["reservationId"] for r in acme] == [world.reservation]
    globex = json_of(world, "pools", key=world.globex_key)
    assert [p["name"] for p in globex] == ["mixed"]
    assert json_of(world, "reservations", key=world.globex_key) == []
    # Another tenant's reservation is as absent as a missing one.
    other = piped(world, "reservation", world.reservation, key=world.globex_key)
    assert other.code == 1 and "404 NOT_FOUND" in other.err, other.err
    denied = piped(world, "tenants", key=world.globex_key)
    assert denied.code == 1 and "PERMISSION_DENIED" in denied.err
    # Generated commands fill in tenantId too.
    summary = json_of(world, "api", "capacity.summary", key=world.acme_key)
    assert summary["tenantId"] == "acme"


def test_writes_answer_in_one_line_and_every_method_takes_flags(world: World) -> None:
    into = on_terminal(world, "maintenance", "h100-a", "--reason", "swap PSU")
    assert into.code == 0 and into.out.strip().startswith("h100-a → maintenance (swap PSU)")
    assert len(into.out.strip().splitlines()) == 1, into.out
    # The booking it put at risk says so, and why, in the reservations table.
    (held,) = [
        x for x in on_terminal(world, "reservations").out.splitlines() if world.reservation in x
    ]
    # (IDLE SINCE, when the booking runs nothing, sits between NODES and AT RISK.)
    assert re.search(r"h100-a\s+(\S+\s+)?maintenance$", held.rstrip()), held
    out = piped(world, "maintenance", "h100-a", "--off")
    assert json.loads(out.out)["nodeId"] == "h100-a"
    assert "out of maintenance" in on_terminal(world, "maintenance", "h100-a", "--off").out
    preview = piped(
        world, "api", "capacity.preview", "--pool-id", world.h100,
        "--devices", "class=gpu,count=2", "--duration", "1h", key=world.acme_key,
    )  # fmt: skip
    assert preview.code == 0 and json.loads(preview.out)["fits"] is True, preview.err
    booked = on_terminal(
        world, "api", "reservations.create", "--pool-id", world.h100, "--devices",
        "class=gpu,count=1", "--duration", "30m", "--idempotency-key", "cli-2", key=world.acme_key,
    )  # fmt: skip
    assert re.match(r"rsv_\w+ active: 1 gpu on h100-a, ", booked.out.strip()), booked.out
    rid = booked.out.split()[0]
    released = on_terminal(world, "api", "reservations.release", "--reservation-id", rid,
                           key=world.acme_key)  # fmt: skip
    assert released.out.strip() == f"{rid} → released", released.out
    made = on_terminal(world, "key-create", "globex", "--label", "x")
    assert re.search(r"key \w{16} for globex \(tenant\), shown once:\ngpf_", made.out), made.out


def test_errors_are_one_line_naming_url_code_and_field(world: World) -> None:
    wrong = piped(world, "call", "reservations", "{}")
    assert wrong.code == 2 and "not a method" in wrong.err and "reservations.list" in wrong.err
    assert len(wrong.err.strip().splitlines()) == 1
    nats = piped(world, "pools", env={"GPUFLEET_URL": world.nats_url.replace("nats:", "http:")})
    assert nats.code == 1 and "NATS server" in nats.err and world.nats_url[7:] in nats.err
    bad = piped(world, "api", "capacity.summary", "--tenant-id", "no spaces")
    assert bad.code == 1 and len(bad.err.strip().splitlines()) == 1
    assert world.fleet.url in bad.err and "INVALID_INPUT" in bad.err and "tenantId" in bad.err
    refused = piped(world, "pools", env={"GPUFLEET_URL": "http://127.0.0.1:9"})
    assert refused.code == 1 and "http://127.0.0.1:9" in refused.err
    for url in ("127.0.0.1:8080", "notaurl", "http://[::1"):  # no scheme, no host, broken
        odd = piped(world, "pools", env={"GPUFLEET_URL": url})
        assert odd.code == 1 and len(odd.err.strip().splitlines()) == 1, odd.err
        assert f"cannot reach the coordinator at {url}/api/" in odd.err, odd.err
    # alerts watch: a NATS port nobody listens on (1), an HTTP URL, a config error naming
    # the setting (2): one line, at once.
    for nats_url, code, said in (
        ("nats://127.0.0.1:9", 1, "cannot connect to NATS"),
        (
            world.fleet.url,
            2,
            "nats_url: " + repr(world.fleet.url) + " is not a nats://host:port URL",
        ),
    ):
        feed = piped(world, "alerts", "watch", "--idle", "2", env={"GPUFLEET_NATS_URL": nats_url})
        assert feed.code == code and said in feed.err, feed.err
        assert len(feed.err.strip().splitlines()) == 1, feed.err
    nokey = piped(world, "pools", env={"GPUFLEET_KEY": ""})
    assert nokey.code == 2 and "API key" in nokey.err
    # `call` alone lists every method, as the hint above says.
    listed = [line.split()[0] for line in piped(world, "call").out.splitlines()]
    assert {"reservations.list", "tenants.list", "apiKeys.list", "usage.report"} <= set(listed)
    notjson = piped(world, "call", "capacity.summary", "{not json")
    assert notjson.code == 2 and "not JSON" in notjson.err
    # A reader that goes away (`gpufleet … | head`) ends it quietly.
    proc = subprocess.Popen(
        [str(BIN / "gpufleet"), "api", "nodes.get", "--node-id", "h100-a"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.env(),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    # click ends a command whose reader left with exit 1, quietly (stderr stays empty).
    assert proc.wait(30) in (0, 1, 141) and err == "", err
    proc.stderr.close()


def test_version_completion_and_usage_csv(world: World) -> None:
    for args in ([], ["api"], ["alerts"]):  # a group alone: its help, as is
        bare = piped(world, *args)
        assert bare.code == 2 and bare.err.startswith("Usage: gpufleet"), bare.err
        assert "Commands:" in bare.err and "(see gpufleet" not in bare.err, bare.err
    assert re.match(r"gpufleet, version \d", piped(world, "--version").out)
    for shell, marker in (("bash", "complete "), ("zsh", "compdef"), ("fish", "complete ")):
        script = piped(world, "completion", shell)
        assert script.code == 0 and marker in script.out and "_GPUFLEET_COMPLETE" in script.out
    words = subprocess.run(
        [str(BIN / "gpufleet")], capture_output=True, text=True, timeout=30,
        env=world.env() | {"_GPUFLEET_COMPLETE": "bash_complete", "COMP_WORDS": "gpufleet res",
                           "COMP_CWORD": "1"},
    ).stdout  # fmt: skip
    assert "reservations" in words and "reservation" in words
    rows = list(
        csv.DictReader(io.StringIO(piped(world, "usage", "-o", "csv", "--from", "-1d").out))
    )
    assert rows and rows[0]["resource"] == "gpu" and float(rows[0]["hours"]) > 0
    # Beside the booked hours, the used ones and the efficiency (issue 24).
    assert {"usedHours", "weightedHours", "efficiency"} <= set(rows[0])
    per = piped(world, "usage", "-o", "csv", "--from", "-1d", "--by-reservation").out
    booked = list(csv.DictReader(io.StringIO(per)))
    assert booked and all(r["reservationId"].startswith("rsv_") for r in booked), per
    # Chargeback as FOCUS 1.2 rows (issue 35): the header, whatever ran; and the same
    # rows as Parquet with FOCUS's types (pyarrow, the export extra), to a file only.
    grid = int(time.time() * 1000) // 900_000 * 900_000
    window = ("--from", str(grid - 4 * 900_000), "--to", str(grid + 900_000))
    focus = piped(world, "usage", "export", "--format", "focus-csv", *window)
    assert focus.code == 0, focus.err
    header = next(csv.reader(io.StringIO(focus.out)))
    assert header[:3] == ["BillingAccountId", "BillingCurrency", "BillingPeriodStart"], header
    assert "CapacityReservationStatus" in header
    refused = piped(world, "usage", "export", "--format", "focus-parquet", *window)
    assert refused.code == 2 and "--out" in refused.err, refused.err
    target = world.tmp / "focus.parquet"
    wrote = piped(world, "usage", "export", "--format", "focus-parquet", "--out", str(target),
                  *window)  # fmt: skip
    assert wrote.code == 0, wrote.err
    table = pq.read_table(target)
    assert table.schema.names == header and table.num_rows == len(focus.out.splitlines()) - 1
    assert str(table.schema.field("ChargePeriodStart").type) == "timestamp[ms, tz=UTC]"
    assert str(table.schema.field("BilledCost").type) == "decimal128(38, 10)"
    off = piped(world, "usage", "export", "--from", str(grid + 1), "--to", str(grid + 900_000))
    assert off.code != 0 and "from" in off.err, off.err


def test_alerts_watch_follows_the_stream_and_watch_draws_a_frame(world: World) -> None:
    piped(world, "maintenance", "h100-a", "--reason", "alert test")
    piped(world, "maintenance", "h100-a", "--off")
    lines = piped(world, "alerts", "watch", "--since", "-10m", "--pool", world.h100,
                  "--count", "3", "--idle", "20")  # fmt: skip
    alerts = [json.loads(line) for line in lines.out.splitlines()]
    assert lines.code == 0 and len(alerts) == 3, lines.err
    assert all(a["poolId"] == world.h100 for a in alerts)
    # Maintenance of a node that holds bookings also puts them at risk (reservation.*).
    assert all(a["kind"].split(".")[0] in ("node", "reservation") for a in alerts)
    assert "node.maintenance" in [a["kind"] for a in alerts]
    assert all(re.match(r"\d{4}-", a["at"]) for a in alerts)
    # Every alert of the last ten minutes (earlier tests' too), then 3 s of quiet ends it.
    table = on_terminal(
        world, "alerts", "watch", "--since", "-10m", "--count", "200", "--idle", "3"
    )
    assert "node.maintenance" in table.out and "alert test" in table.out, table.out
    frame = on_terminal(world, "watch", "--count", "1")
    assert frame.code == 0 and "GPUs:" in frame.out and "h100-a" in frame.out, frame.out
    # Piped: a JSON line per frame, its times RFC 3339 like every other view's.
    line = piped(world, "watch", "--count", "1", "--pool", "h100-east")
    data = json.loads(line.out)
    assert [n["nodeId"] for n in data["nodes"]] == ["h100-a"], data
    assert re.match(r"\d{4}-\d\d-\d\dT", data["nodes"][0]["lastSeen"]), data
    assert not re.search(r'"(lastSeen|since|at)": \d', line.out), line.out
    unknown = piped(world, "nodes", "--pool", "no-such-pool")
    assert unknown.code == 2 and "no pool named 'no-such-pool'" in unknown.err, unknown.err


# What a process's environment or an agent may put in an owner or a reason (issue 32):
# OSC 52 (write the clipboard), a screen clear, and rich markup for a hidden hyperlink.
PAYLOAD = "\x1b]52;c;ZXZpbA==\x1b\\\x1b[2J[link=https://evil.example]rsv_ok[/link]"


def test_server_strings_reach_the_terminal_inert(world: World) -> None:
    """A reason carrying the payload, in every printer a terminal shows it through: the
    terminal receives none of its escapes and no hyperlink, only its text, visibly."""
    said = on_terminal(world, "maintenance", "h100-a", "--reason", PAYLOAD)
    try:
        assert said.code == 0, said.out
        views = [
            ["nodes"], ["nodes", "-o", "wide"], ["node", "h100-a"],
            ["alerts", "watch", "--since", "-2m", "--pool", world.h100, "--count", "100",
             "--idle", "3"],
        ]  # fmt: skip
        for args in views:
            code, raw = terminal_bytes(world, *args)
            assert code == 0, (args, raw)
            # No OSC (clipboard, hyperlink, title), no string terminator, no clear.
            for escape in (b"\x1b]", b"\x1b\\", b"\x1b[2J", b"\x07"):
                assert escape not in raw, (args, escape, raw)
            text = raw.decode()
            assert "[link=https://evil.example]rsv_ok[/link]" in text, (args, text)
            assert "\\x1b]52;c;ZXZpbA==" in text, (args, text)
    finally:
        piped(world, "maintenance", "h100-a", "--off")
    # A reason a spreadsheet would run as a formula is text in CSV.
    formula = '=HYPERLINK("https://evil.example","ok")'
    piped(world, "maintenance", "h100-a", "--reason", formula)
    try:
        rows = list(csv.DictReader(io.StringIO(piped(world, "nodes", "-o", "csv").out)))
        assert [r["why"] for r in rows] == ["'" + formula], rows
    finally:
        piped(world, "maintenance", "h100-a", "--off")


def test_coordinator_logs_access_and_audit_lines_without_secrets(world: World) -> None:
    made = json_of(world, "api", "apiKeys.create", "--tenant-id", "globex")
    m = piped(world, "maintenance", "h100-a", "--reason", "audit me")
    assert m.code == 0, m
    piped(world, "maintenance", "h100-a", "--off")
    assert piped(world, "maintenance", "no-such-node", "--reason", "x").code == 1
    log = (world.tmp / "coordinator.log").read_text()
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    audits = [r for r in records if r.get("event") == "audit"]
    mine = [
        r for r in audits if r["method"] == "apiKeys.create" and r["input"]["tenantId"] == "globex"
    ]
    operator_id = world.fleet.operator_key.split("_")[1]
    assert mine and all(r["keyId"] == operator_id and r["tenantId"] == "operator" for r in mine)
    assert any(r["method"] == "nodes.setMaintenance" and r["result"] == "ok" for r in audits), [
        (r["method"], r["result"]) for r in audits
    ]
    assert any(r["result"] == "refused" and r["code"] for r in audits)
    assert any(r.get("event") == "access" and r["status"] == 200 for r in records)
    for secret in (made["key"], world.fleet.operator_key, world.acme_key):
        assert secret.split("_", 2)[2] not in log


BLOCK = """
import sys

class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("aiohttp", "sqlalchemy"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Block())
"""


def test_the_cli_needs_neither_aiohttp_nor_sqlalchemy(world: World, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    env = {"PYTHONPATH": str(tmp_path)}
    for args in (["pools"], ["node", "h100-a"], ["api", "usage.report"], ["--help"]):
        ran = piped(world, *args, env=env)
        assert ran.code == 0, (args, ran.err)


def test_agent_inventory_prints_what_it_would_offer() -> None:
    def inventory(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "gpufleet-agent"), "inventory", "--simulate", "h100-sxm-8",
             "--node-id", "probe", *args],
            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    seen = inventory("-o", "json")
    assert seen.returncode == 0, seen.stderr
    inv = json.loads(seen.stdout)
    assert len(inv["gpus"]) == 8 and inv["poolId"] is None
    offered = {a["attrs"].get("nic") for a in inv["atoms"] if a["class"] == "nic.vf"}
    for nic in inv["nics"]:  # the simulated host's management NIC is listed, not offered
        assert nic["bookable"] == (nic["name"] in offered), nic
    # Each NIC names its card (issue 31): InfiniBand by node GUID, Ethernet by its MAC.
    assert {n["physicalId"].split(":")[0] for n in inv["nics"]} == {"guid", "mac"}
    first = next(n["name"] for n in inv["nics"] if n["bookable"])
    managed = json.loads(inventory("-o", "json", "--management-nic", first).stdout)
    nic = next(n for n in managed["nics"] if n["name"] == first)
    assert nic["bookable"] is False
    assert not any(a["attrs"].get("nic") == first for a in managed["atoms"])
    table = inventory("--management-nic", first)
    assert "GPUs (8):" in table.stdout and "no (management)" in table.stdout
    assert inv["nics"][0]["physicalId"] in table.stdout
    assert "atoms it would offer: 1 node, 8 gpu" in table.stdout
    bad = inventory("-o", "yaml")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
