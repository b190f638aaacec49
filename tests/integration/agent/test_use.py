"""The agent's use reports against a real nats-server: simulated workloads seen with
their owners, the start state as a full UseReport, later changes inline in heartbeats
under 1 KiB, and use requests answered with the whole state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import nats
from nats.aio.msg import Msg

from agent.config import Settings
from agent.sim.faults import write_faults
from ops.kit.nats_users import AgentNode, NatsUser, agent_permissions, agent_user
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import DeviceUse, Heartbeat, Inventory, UseReport
from tests.integration.agent.test_nats import (
    PREFIX,
    WATCHER,
    agent,
    nats_with_users,
    publisher_for,
    settings,
    state,
)

RSV = "rsv_01jabcdefghjkmnpqrstvwxyz0"
# How long a report or heartbeat may take to arrive: an agent starting beside a full CI
# run (3 workers on 2 cores) once took over 10 s to send its first report.
PATIENCE_S = 30
POD = "1234abcd-5678-90ab-cdef-1234567890ab"
KUBE = f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{'b' * 64}.scope"
WORKLOADS = [
    {
        "kind": "process",
        "pid": 4242,
        "gpus": [0, 1],
        "memory_mib": 40960,
        "env": {"GPUFLEET_RESERVATION_ID": RSV, "PATH": "/usr/bin"},
        "util": {"shape": "constant", "level": 85},
    },
    {"kind": "process", "pid": 777, "gpu": 3, "memory_mib": 2048, "cgroup": KUBE},
    {
        "kind": "process",
        "pid": 9,
        "gpu": 5,
        "memory_mib": 512,
        "cgroup": "0::/system.slice/miner.service",
        "util": {"shape": "constant", "level": 30},
    },
    # An MPS-shared GPU: the compute call lists the daemon, the MPS call the client.
    {
        "kind": "process",
        "pid": 50,
        "gpu": 7,
        "memory_mib": 30,
        "comm": "nvidia-cuda-mps-server",
        "cgroup": "0::/system.slice/nvidia-mps.service",
    },
    {
        "kind": "process",
        "pid": 51,
        "gpu": 7,
        "memory_mib": 8192,
        "mps": True,
        "env": {"GPUFLEET_RESERVATION_ID": RSV},
        "util": {"shape": "constant", "level": 60},
    },
]


class Listener:
    def __init__(self) -> None:
        self.heartbeats: asyncio.Queue[tuple[int, Heartbeat]] = asyncio.Queue()
        self.reports: asyncio.Queue[UseReport] = asyncio.Queue()
        self.inventories: asyncio.Queue[Inventory] = asyncio.Queue()

    async def hb(self, msg: Msg) -> None:
        await self.heartbeats.put((len(msg.data), Heartbeat.from_json(msg.data)))

    async def use(self, msg: Msg) -> None:
        await self.reports.put(UseReport.from_json(msg.data))

    async def inv(self, msg: Msg) -> None:
        await self.inventories.put(Inventory.from_json(msg.data))


async def listening(nats_url: str, s: Settings) -> tuple[nats.NATS, Listener]:
    """A connection hearing the agent's heartbeats, use reports and inventories."""
    subjects = Subjects(s.nats.subject_prefix)
    nc = await nats.connect(nats_url)
    seen = Listener()
    await nc.subscribe(subjects.heartbeat(s.pool_id, s.node_id), cb=seen.hb)
    await nc.subscribe(subjects.use(s.pool_id, s.node_id), cb=seen.use)
    await nc.subscribe(subjects.inventory(s.pool_id, s.node_id), cb=seen.inv)
    await nc.flush()
    return nc, seen


def owners(devices: tuple[DeviceUse, ...], uuid: str) -> list[tuple[int, str, str]]:
    (device,) = [d for d in devices if d.device_id == uuid]
    return [(p.pid, p.owner_kind, p.owner) for p in device.processes]


async def test_use_reports_and_heartbeat_changes(nats_url: str, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    write_faults(faults, WORKLOADS)
    s = settings(nats_url, fault_file=faults, interval_s=0.2)
    subjects = Subjects(s.nats.subject_prefix)
    nc, seen = await listening(nats_url, s)
    try:
        async with agent(s):
            inv = await asyncio.wait_for(seen.inventories.get(), 10)
            uuid = {g.index: g.uuid for g in inv.gpus}
            # Eight GPUs at start are more than a heartbeat's budget: a report.
            first = await asyncio.wait_for(seen.reports.get(), PATIENCE_S)
            assert [d.device_id for d in first.devices] == [uuid[i] for i in range(8)]
            assert first.node_id == s.node_id and first.boot_id == inv.boot_id
            assert owners(first.devices, uuid[0]) == [(4242, "reservation", RSV)]
            assert owners(first.devices, uuid[1]) == [(4242, "reservation", RSV)]
            assert owners(first.devices, uuid[3]) == [(777, "pod", POD)]
            assert owners(first.devices, uuid[5]) == [(9, "systemd", "miner.service")]
            assert owners(first.devices, uuid[7]) == [
                (50, "systemd", "nvidia-mps.service"),
                (51, "reservation", RSV),
            ]
            busy = next(d for d in first.devices if d.device_id == uuid[0])
            assert (busy.sm_util, busy.memory_used_mib) == (85, 40960)
            size, hb = await asyncio.wait_for(seen.heartbeats.get(), PATIENCE_S)
            while hb.use_version < first.use_version:
                size, hb = await asyncio.wait_for(seen.heartbeats.get(), PATIENCE_S)
            assert size < 1024 and hb.use == ()
            version = hb.use_version
            # A new, unbooked process: the next heartbeat carries just that GPU's change.
            new = {"kind": "process", "pid": 31337, "gpu": 6, "memory_mib": 1024}
            write_faults(faults, [*WORKLOADS, new])
            while not hb.use:
                size, hb = await asyncio.wait_for(seen.heartbeats.get(), PATIENCE_S)
                assert size < 1024
            assert (hb.use_base, hb.use_version) == (version, version + 1)
            assert [d.device_id for d in hb.use] == [uuid[6]]
            assert owners(hb.use, uuid[6]) == [(31337, "unknown", "")]
            assert seen.reports.empty()
            # Asked, the agent answers with everything, and publishes it too.
            subject = subjects.use_request(s.pool_id, s.node_id)
            answer = UseReport.from_json((await nc.request(subject, b"", timeout=5)).data)
            published = await asyncio.wait_for(seen.reports.get(), PATIENCE_S)
            assert answer.use_version == published.use_version == hb.use_version
            assert answer.devices == published.devices and len(answer.devices) == 8
            assert owners(answer.devices, uuid[6]) == [(31337, "unknown", "")]
            await nc.publish(subject, b"")  # no reply subject: published only
            again = await asyncio.wait_for(seen.reports.get(), PATIENCE_S)
            assert again.devices == answer.devices
    finally:
        await nc.close()


async def test_an_agent_with_its_own_credentials_may_send_and_be_asked_for_use(
    tmp_path: Path,
) -> None:
    """What `gpufleet nats-auth` grants an agent covers use: reports out, requests in,
    and no NATS error counted."""
    pool = new_pool_id()
    node = AgentNode(pool, "gpu-a")
    subjects = Subjects(PREFIX)
    user = NatsUser(agent_user(node), "agent", agent_permissions(subjects, node), node)
    devices = tuple(DeviceUse(device_id=f"GPU-{i:036d}", sm_util=0) for i in range(8))
    with nats_with_users(tmp_path, user) as server:
        nc = await nats.connect(server.url, user=WATCHER, password="watcher-pw")
        seen = Listener()
        await nc.subscribe(subjects.use(pool, "gpu-a"), cb=seen.use)
        await nc.flush()
        pub = publisher_for(server, tmp_path / "agent.creds", pool, "gpu-a")
        pub.update(msgspec.structs.replace(state(pool, "gpu-a"), use=devices))
        task = asyncio.create_task(pub.run(), name="publisher")
        try:
            first = await asyncio.wait_for(seen.reports.get(), PATIENCE_S)
            request = subjects.use_request(pool, "gpu-a")
            reply = await nc.request(request, b"", timeout=5)
            answered = UseReport.from_json(reply.data)
            await asyncio.wait_for(seen.reports.get(), PATIENCE_S)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await nc.close()
    assert first.devices == answered.devices == devices
    assert pub.stats.bus_errors == 0 and pub.stats.use_requests == 1


async def test_owners_host_memory_follows_the_workloads_curves(
    nats_url: str, tmp_path: Path
) -> None:
    """Issue 35: a simulated workload's host memory curve is written into the fake cgroup
    tree; the agent reads each owner's cgroup and sends it in its use, the start in the
    full report, a rise past the step inline in a heartbeat under 1 KiB."""
    wave = {"shape": "square", "low": 1000, "high": 2000, "period_s": 1.6, "duty": 0.5}
    workloads = [
        {
            "kind": "process", "pid": 4242, "gpu": 0, "memory_mib": 1024, "host_memory_mib": 6000,
            "env": {"GPUFLEET_RESERVATION_ID": RSV, "SLURM_JOB_ACCOUNT": "physics"},
            "cgroup": "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0",
        },
        {"kind": "process", "pid": 777, "gpu": 3, "memory_mib": 2048, "cgroup": KUBE,
         "host_memory_mib": wave},
    ]  # fmt: skip
    faults = tmp_path / "faults.json"
    write_faults(faults, workloads)
    s = settings(nats_url, fault_file=faults, interval_s=0.2)
    nc, seen = await listening(nats_url, s)
    try:
        async with agent(s):
            first = await asyncio.wait_for(seen.reports.get(), PATIENCE_S)
            held = {(m.owner_kind, m.owner): m for m in first.memory}
            assert set(held) == {("reservation", RSV), ("pod", POD)}
            job = held[("reservation", RSV)]
            assert (job.current_mib, job.slurm_account) == (6000, "physics")
            assert held[("pod", POD)].current_mib in (1000, 2000)
            # The pod's memory goes up and down: heartbeats carry each change, in budget.
            inline: set[int] = set()
            while inline != {1000, 2000}:
                size, hb = await asyncio.wait_for(seen.heartbeats.get(), PATIENCE_S)
                assert size < 1024
                for m in hb.memory:
                    assert (m.owner_kind, m.owner) == ("pod", POD)
                    inline.add(m.current_mib)
            assert seen.reports.empty()
    finally:
        await nc.close()
