"""No false unreachable from the coordinator's own trouble, and fast true detection:
50 real agent processes, a nats-server restart, then 3 agents killed."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ops.embedded_nats import EmbeddedNats
from tests.e2e.fleet_procs import Fleet, wait_for

pytestmark = pytest.mark.e2e

AGENTS = 50
INTERVAL_S = 2.0
MISSES = 3
WINDOW_S = MISSES * INTERVAL_S


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


def _unreachable_events(fleet: Fleet, node_ids: list[str]) -> dict[str, list[int]]:
    op = fleet.operator()
    found: dict[str, list[int]] = {}
    for node_id in node_ids:
        events = op.call("nodes.events", {"tenantId": "acme", "nodeId": node_id})["events"]
        times = [e["at"] for e in events if e["kind"] == "node.unreachable"]
        if times:
            found[node_id] = times
    return found


def test_nats_restart_marks_nothing_unreachable_and_killed_agents_are_caught(
    fleet: tuple[Fleet, EmbeddedNats],
) -> None:
    f, nats_server = fleet
    f.start_coordinator("--misses", str(MISSES))
    op = f.operator()
    op.call("tenants.create", {"tenantId": "acme"})
    pool = op.call("pools.create", {"tenantId": "acme", "name": "big"})["poolId"]
    names = [f"node-{i:02d}" for i in range(AGENTS)]
    for name in names:
        f.start_agent(name, pool, "l40s-pcie-4", INTERVAL_S)

    def all_ready() -> bool:
        nodes = _nodes(f, pool)
        return len(nodes) == AGENTS and all(n["status"] == "ready" for n in nodes)

    wait_for(all_ready, timeout=120, what=f"{AGENTS} nodes ready")

    # The bus goes away for longer than a detection window, then comes back.
    nats_server.stop()
    time.sleep(WINDOW_S + 1)
    nats_server.start()
    # Agents reconnect; give it two windows and a margin, watching all the while.
    deadline = time.monotonic() + 2 * WINDOW_S + 2
    while time.monotonic() < deadline:
        assert all(n["status"] == "ready" for n in _nodes(f, pool))
        time.sleep(0.5)
    assert _unreachable_events(f, names) == {}

    victims = names[:3]
    killed_at = int(time.time() * 1000)
    for name in victims:
        f.agents[name].send_signal(signal.SIGKILL)

    def victims_unreachable() -> bool:
        status = {n["nodeId"]: n["status"] for n in _nodes(f, pool)}
        return all(status[v] == "unreachable" for v in victims)

    wait_for(victims_unreachable, timeout=3 * WINDOW_S, what="killed agents unreachable")
    caught = _unreachable_events(f, names)
    assert sorted(caught) == victims  # those three and only they
    for name in victims:
        assert caught[name][0] - killed_at <= (WINDOW_S + 1) * 1000, (name, caught[name])
    rows = op.call("capacity.byPool", {"tenantId": "acme", "poolId": pool})["rows"]
    node_row = next(r for r in rows if r["resource"] == "node")
    assert (node_row["unreachable"], node_row["allocatable"]) == (3, AGENTS - 3)
