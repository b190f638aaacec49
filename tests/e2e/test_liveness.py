"""No false unreachable from the coordinator's own trouble, and fast true detection,
with real agent processes of DIFFERENT intervals (SPEC §3-4): after a nats-server
restart each node is quiet for its own misses x interval, never the fleet's largest.

12 agents: six beat every 2 s (window 6 s), three every 4 s (12 s), three every 10 s
(30 s). One 2 s agent is killed, then NATS is down for longer than the short window.
Without a quiet window the five living 2 s nodes are marked unreachable the moment the
coordinator is back (5 of 12: too few for the mass-silence rule to hide it); with the
fleet's largest window the killed one is caught 30 s after the restart, not 6 s."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ops.kit.embedded_nats import EmbeddedNats
from tests.e2e.fleet_procs import Fleet, wait_for

pytestmark = pytest.mark.e2e

MISSES = 3
INTERVALS_S = {
    **{f"short-{i}": 2.0 for i in range(6)},
    **{f"mid-{i}": 4.0 for i in range(3)},
    **{f"long-{i}": 10.0 for i in range(3)},
}
SHORT_WINDOW_S = MISSES * 2.0
LONGEST_WINDOW_S = MISSES * 10.0
OUTAGE_S = SHORT_WINDOW_S + 1
VICTIM = "short-5"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Fleet, EmbeddedNats]]:
    with EmbeddedNats(store_dir=str(tmp_path / "js")) as nats_server:
        f = Fleet(tmp_path, nats_server.url)
        try:
            yield f, nats_server
        finally:
            f.close()


def _nodes(fleet: Fleet, pool: str) -> list[dict[str, Any]]:
    out = fleet.operator().call("nodes.list", {"tenantId": "acme", "poolId": pool, "limit": 1000})
    return list(out["nodes"])


def _status(fleet: Fleet, pool: str) -> dict[str, str]:
    return {n["nodeId"]: n["status"] for n in _nodes(fleet, pool)}


def _unreachable_events(fleet: Fleet) -> dict[str, list[int]]:
    op = fleet.operator()
    found: dict[str, list[int]] = {}
    for node_id in INTERVALS_S:
        events = op.call("nodes.events", {"tenantId": "acme", "nodeId": node_id})["events"]
        times = [e["at"] for e in events if e["kind"] == "node.unreachable"]
        if times:
            found[node_id] = times
    return found


def test_after_a_nats_restart_each_node_is_judged_by_its_own_window(
    fleet: tuple[Fleet, EmbeddedNats],
) -> None:
    f, nats_server = fleet
    f.start_coordinator("--misses", str(MISSES), "--sweep-interval-s", "0.1")
    op = f.operator()
    op.call("tenants.create", {"tenantId": "acme"})
    pool = op.call("pools.create", {"tenantId": "acme", "name": "mixed"})["poolId"]
    for name, interval in INTERVALS_S.items():
        f.start_agent(name, pool, "l40s-pcie-4", interval)

    def all_ready_and_beating() -> bool:
        # Ready, and each node's interval known from its heartbeats (not just inventory).
        nodes = _nodes(f, pool)
        return len(nodes) == len(INTERVALS_S) and all(
            n["status"] == "ready" and n["intervalMs"] == INTERVALS_S[n["nodeId"]] * 1000
            for n in nodes
        )

    wait_for(all_ready_and_beating, timeout=60, what=f"{len(INTERVALS_S)} nodes beating")

    f.agents[VICTIM].send_signal(signal.SIGKILL)
    f.agents[VICTIM].wait(5)
    # The bus goes away for longer than the short nodes' window, then comes back.
    nats_server.stop()
    time.sleep(OUTAGE_S)
    nats_server.start()
    restarted_at = int(time.time() * 1000)

    # Watch until the short nodes' window after the restart has passed with margin: the
    # victim is caught by its own window, nobody else is marked meanwhile.
    deadline = time.monotonic() + SHORT_WINDOW_S + 3
    while time.monotonic() < deadline:
        status = _status(f, pool)
        assert {n for n, s in status.items() if s != "ready"} <= {VICTIM}, status
        time.sleep(0.3)
    caught = _unreachable_events(f)
    assert sorted(caught) == [VICTIM], caught
    caught_after_s = (caught[VICTIM][0] - restarted_at) / 1000
    assert caught_after_s < SHORT_WINDOW_S + 3 < LONGEST_WINDOW_S, caught_after_s

    rows = op.call("capacity.byPool", {"tenantId": "acme", "poolId": pool})["rows"]
    node_row = next(r for r in rows if r["resource"] == "node")
    assert (node_row["unreachable"], node_row["allocatable"]) == (1, len(INTERVALS_S) - 1)
