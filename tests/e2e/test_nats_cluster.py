"""A production-shaped deployment on loopback: three clustered nats-servers with
JetStream, two coordinator processes on one PostgreSQL, simulated agents. The server
holding the alert stream's leader dies, then the server the leading coordinator is
connected to, while an agent dies and comes back: every alert the ledger committed
lands in the stream exactly once, no living node is marked unreachable, and every
booking the API acknowledged is kept.

The coordinators are given a dead seed first in their `--nats-url` list: they start on
the next one."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import nats
import pytest
from sqlalchemy import select

from coordinator.bus.alerts import MSG_ID
from coordinator.ledger import schema
from ops.kit.client import ApiClient
from ops.kit.embedded_nats import EmbeddedNatsCluster, free_port
from ops.kit.keys import new_key
from shared.streams import stream_name
from shared.wire import Alert
from tests.database import database
from tests.e2e.fleet_procs import BIN, stop_all, wait_for

pytestmark = pytest.mark.e2e

PREFIX = "gfcluster"
INTERVAL_S = 1.0
AGENTS = ("a1", "a2", "a3")
VICTIM = "a1"


class Procs:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    def spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")
        self._logs.append(log)
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        return self.procs[name]

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        try:
            stop_all(self.procs.values())
        finally:
            for log in self._logs:
                log.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.close()


def _nodes(api: ApiClient, pool: str) -> dict[str, str]:
    out = api.call("nodes.list", {"tenantId": "acme", "poolId": pool, "limit": 100})
    return {n["nodeId"]: n["status"] for n in out["nodes"]}


def _current_server(log: str) -> int:
    """The port of the NATS server a coordinator last said it (re)connected to."""
    ports = re.findall(r"connected to NATS at 127\.0\.0\.1:(\d+)", log)
    assert ports, log[-2000:]
    return int(ports[-1])


async def _stream(url: str) -> tuple[list[tuple[str, str, str]], int]:
    """(msg id, alert id, kind) of every stored alert, and the stream's replica count."""
    nc = await nats.connect(servers=url.split(","))
    try:
        js = nc.jetstream(timeout=5)
        info = await js.stream_info(stream_name(PREFIX))
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream_name(PREFIX), seq)
            assert msg.data is not None
            alert = Alert.from_json(msg.data)
            out.append(((msg.headers or {}).get(MSG_ID, ""), alert.alert_id, alert.kind))
        return out, info.config.num_replicas or 1
    finally:
        await nc.close()


async def _stream_leader(url: str) -> str:
    nc = await nats.connect(servers=url.split(","))
    try:
        info = await nc.jetstream(timeout=5).stream_info(stream_name(PREFIX))
        assert info.cluster is not None and info.cluster.leader
        return info.cluster.leader
    finally:
        await nc.close()


async def _outbox(url: str) -> tuple[list[str], int]:
    o = schema.alert_outbox.c
    async with database(url) as db, db.read() as conn:
        rows = (await conn.execute(select(o.alert_id, o.sent_at).order_by(o.seq))).all()
    return [r[0] for r in rows], sum(1 for r in rows if r[1] is None)


async def test_losing_a_nats_server_loses_no_alert_and_no_booking(
    database_url: str, procs: Procs
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("two coordinator replicas share a PostgreSQL ledger")
    with EmbeddedNatsCluster(3) as cluster:
        key = new_key()
        seeds = f"nats://127.0.0.1:{free_port()},{cluster.url}"  # the first seed is down
        ports = {name: free_port() for name in ("c1", "c2")}
        for name, port in ports.items():
            procs.spawn(
                name,
                [
                    str(BIN / "gpufleet-coordinator"),
                    "--database-url", database_url,
                    "--nats-url", seeds,
                    "--port", str(port),
                    "--subject-prefix", PREFIX,
                    "--misses", "3",
                    "--recovery-hold-s", "0.5",
                    "--sweep-interval-s", "0.2",
                    "--state-dir", str(procs.workdir),
                    "--insecure-bus",  # the test cluster has no users
                ],
                env={"GPUFLEET_BOOTSTRAP_OPERATOR_KEY": key},  # never on a command line
            )  # fmt: skip
        apis = {n: ApiClient(f"http://127.0.0.1:{p}", key, timeout_s=30) for n, p in ports.items()}
        for api in apis.values():
            wait_for(api.healthy, timeout=60, what="coordinator healthy")
        c1, c2 = apis["c1"], apis["c2"]
        c1.call("tenants.create", {"tenantId": "acme"})
        pool = c1.call("pools.create", {"tenantId": "acme", "name": "p"})["poolId"]

        def start_agent(node_id: str) -> None:
            procs.spawn(
                node_id,
                [
                    str(BIN / "gpufleet-agent"),
                    "--pool-id", pool, "--node-id", node_id, "--nats-url", cluster.url,
                    "--simulate", "l40s-pcie-4", "--interval", str(INTERVAL_S),
                    "--subject-prefix", PREFIX,
                ],
            )  # fmt: skip

        for node_id in AGENTS:
            start_agent(node_id)

        def statuses_are(want: dict[str, str]) -> bool:
            return _nodes(c1, pool) == want

        ready = dict.fromkeys(AGENTS, "ready")
        wait_for(lambda: statuses_are(ready), timeout=60, what="agents ready")

        acknowledged: list[str] = []

        def book(api: ApiClient, k: int) -> None:
            body: dict[str, Any] = {
                "tenantId": "acme", "poolId": pool, "devices": [{"class": "gpu", "count": 1}],
                "duration": "1h", "idempotencyKey": f"k{k}",
            }  # fmt: skip
            acknowledged.append(api.call("reservations.create", body)["reservationId"])

        book(c1, 0)
        book(c2, 1)

        # 1. The server holding the alert stream's leader dies; the victim agent too.
        leader_server = await _stream_leader(cluster.url)
        cluster.servers[leader_server].stop()
        procs.procs[VICTIM].send_signal(signal.SIGKILL)
        procs.procs[VICTIM].wait(5)
        book(c1, 2)
        down = ready | {VICTIM: "unreachable"}
        wait_for(lambda: statuses_are(down), timeout=20, what="victim unreachable")
        cluster.servers[leader_server].start()

        # 2. The server the leading coordinator is on dies; the victim comes back.
        leading = next(n for n in ports if "is now the leader" in procs.log(n))
        on = cluster.by_port(_current_server(procs.log(leading)))
        cluster.servers[on].stop()
        start_agent(VICTIM)
        book(c2, 3)
        wait_for(lambda: statuses_are(ready), timeout=30, what="victim back")
        book(c1, 4)
        cluster.servers[on].start()

        # Everything committed goes out; then compare the ledger with the stream.
        deadline = time.monotonic() + 30
        while True:
            committed, unsent = await _outbox(database_url)
            if unsent == 0:
                break
            assert time.monotonic() < deadline, f"{unsent} alerts still unsent"
            await asyncio.sleep(0.2)
        stored, replicas = await _stream(cluster.url)

    assert replicas == 3
    assert [msg_id for msg_id, _, _ in stored] == [alert_id for _, alert_id, _ in stored]
    stored_ids = [alert_id for _, alert_id, _ in stored]
    assert len(stored_ids) == len(set(stored_ids)), "an alert was stored twice"
    assert sorted(stored_ids) == sorted(committed)
    kinds = [kind for _, _, kind in stored]
    assert kinds.count("node.registered") == len(AGENTS)
    assert kinds.count("node.unreachable") == 1 and kinds.count("node.reachable") == 1
    for api in (c1, c2):
        for reservation_id in acknowledged:
            got = api.call(
                "reservations.get", {"tenantId": "acme", "reservationId": reservation_id}
            )
            assert got["reservationId"] == reservation_id
    events = c1.call("nodes.events", {"tenantId": "acme", "nodeId": "a2"})["events"]
    assert "node.unreachable" not in [e["kind"] for e in events]
