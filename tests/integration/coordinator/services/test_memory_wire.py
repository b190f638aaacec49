"""Owners' memory from the bus to the bill (issue 35, point 1), on a running coordinator
with a real nats-server and ledger (SQLite and PostgreSQL): an agent's use report and
heartbeats carry owners' cgroup memory; the consumption API then shows the pod the
operator's rule gives to acme under acme, and the Slurm job no rule matches apart, as
unattributed, in the ratio of what they held."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import nats
import pytest

from coordinator.app import Coordinator, running_coordinator
from coordinator.domain.intervals import INTERVAL_MS as Q
from shared.clock import FakeClock
from shared.wire import OwnerMemory, UseReport
from tests.integration.conftest import Api, coordinator_settings
from tests.integration.coordinator.api.test_intervals import iso
from tests.integration.coordinator.services.use_agent import Agent, gpu, use_passes
from tests.waiting import eventually


@pytest.fixture
async def ruled(
    database_url: str, nats_url: str, clock: FakeClock, tmp_path: Path
) -> AsyncIterator[Coordinator]:
    rules = tmp_path / "tenants.toml"
    rules.write_text('[[rule]]\nk8s_namespace = "ml"\ntenant = "acme"\n')
    settings = coordinator_settings(
        database_url, nats_url, use_interval_s=0.05, use_flush_s=0, tenant_rules=str(rules)
    )
    async with running_coordinator(settings, clock) as c:
        yield c


async def test_owner_memory_reaches_consumption_by_tenant(
    ruled: Coordinator, clock: FakeClock
) -> None:
    key = ruled.settings.bootstrap_operator_key
    assert key is not None
    nc = await nats.connect(ruled.settings.nats.url)
    try:
        await _charged(ruled, clock, nc, key)
    finally:
        await nc.close()


async def _charged(ruled: Coordinator, clock: FakeClock, nc: nats.NATS, key: str) -> None:
    async with aiohttp.ClientSession() as session:
        api = Api(session, ruled.url, key)
        agent = await Agent.registered(ruled, nc, api, gpus=1)
        agent.version += 1
        report = UseReport(
            node_id=agent.inv.node_id, pool_id=agent.inv.pool_id, boot_id=agent.inv.boot_id,
            sent_at=0, use_version=agent.version, devices=(gpu("GPU-n1-0"),),
            memory=(
                OwnerMemory(owner_kind="pod", owner="uid-1", current_mib=2048, k8s_namespace="ml"),
                OwnerMemory(owner_kind="slurm", owner="42", current_mib=512),
            ),
        )  # fmt: skip
        await nc.publish(agent.subjects.use(report.pool_id, report.node_id), report.to_json())
        watch = ruled.gpu_use
        assert watch is not None

        async def held() -> bool:
            node = watch.book.nodes.get(agent.inv.node_id)
            return node is not None and len(node.memory) == 2

        await agent.beat_same_use()
        await eventually(held)
        start = clock.now_ms() - clock.now_ms() % Q
        for _ in range(12):  # passes 1 s apart, the node beating (reachable, use fresh)
            clock.advance(1_000)
            await agent.beat_same_use()
            await use_passes(ruled)

        async def rows() -> dict[str | None, float]:
            query = {"from": iso(start), "to": iso(start + 4 * Q)}
            async with session.get(
                f"{ruled.url}/api/capacity/consumption", params=query,
                headers={"X-API-Key": key},
            ) as resp:  # fmt: skip
                assert resp.status == 200
                body = await resp.json()
            return {r["tenantId"]: r["usedGbHours"] for r in body["intervals"]}

        async def both() -> bool:
            got = await rows()
            return got.get("acme", 0) > 0 and got.get(None, 0) > 0

        await eventually(both)
        got = await rows()
        assert set(got) == {"acme", None}
        assert got["acme"] == pytest.approx(4 * got[None], rel=1e-3)
