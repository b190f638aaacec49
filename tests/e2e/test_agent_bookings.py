"""Bookings a workload binds to, end to end (issue 24): a real coordinator, nats-server
and simulated agents as subprocesses; reservations made through the HTTP API; then
`gpufleet-agent bookings` and `gpufleet-agent env RSV_ID` as a launcher runs them,
piped and on a terminal (a pty). `env` prints exactly the reservation's devices (GPU
UUIDs in index order, MIG UUIDs, VF PCI addresses); a reservation not live on the node
is an error with a non-zero exit; a restarted agent that lost its state file is told
its bookings again; the NFD feature file names the tenant of a whole-node booking. The
commands run with the agent's settings (node id, interval): a running agent keeps its
quiet file confirmed, a stopped one's goes stale and `env` refuses it (exit 3), and
another node's file is refused (exit 2)."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest

from ops.kit.embedded_nats import EmbeddedNats
from shared.subjects import Subjects
from shared.wire import Heartbeat
from tests.e2e.fleet_procs import Fleet, stop, wait_for
from tests.terminal import on_pty

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent
AGENT = str(BIN / "gpufleet-agent")


@dataclass
class World:
    fleet: Fleet
    tmp: Path
    pools: dict[str, str]  # node → pool

    def state_dir(self, node: str) -> Path:
        return self.tmp / f"state-{node}"

    def nfd_dir(self, node: str) -> Path:
        return self.tmp / f"nfd-{node}"

    def start(self, node: str, profile: str) -> None:
        self.state_dir(node).mkdir(exist_ok=True)  # as systemd's StateDirectory= would
        self.fleet.start_agent(
            node, self.pools[node], profile, 1.0,
            "--state-dir", str(self.state_dir(node)), "--nfd-features-dir", str(self.nfd_dir(node)),
        )  # fmt: skip

    def book(self, node: str, key: str, devices: list[dict[str, Any]], **extra: Any) -> Any:
        body = {"tenantId": "acme", "poolId": self.pools[node], "devices": devices,
                "duration": "1h", "idempotencyKey": key} | extra  # fmt: skip
        return self.fleet.operator().call("reservations.create", body)

    def held(self, node: str) -> dict[str, Any]:
        ran = piped(node, self, "bookings", "--json")
        return json.loads(ran.stdout) if ran.returncode == 0 else {"bookings": []}

    def holds(self, node: str, rid: str) -> bool:
        return any(b["reservationId"] == rid for b in self.held(node)["bookings"])


def cli(node: str, world: World, args: tuple[str, ...], as_node: str | None) -> list[str]:
    """The command as a launcher on `node` runs it, with the agent's settings (the
    agents beat every second); `as_node`: run as if on another host."""
    return [AGENT, *args, "--state-dir", str(world.state_dir(node)),
            "--node-id", as_node or node, "--interval", "1"]  # fmt: skip


def piped(
    node: str, world: World, *args: str, as_node: str | None = None
) -> subprocess.CompletedProcess[str]:
    ran = subprocess.run(
        cli(node, world, args, as_node),
        capture_output=True, text=True, timeout=60, env={"PATH": f"{BIN}:/usr/bin:/bin"},
    )  # fmt: skip
    assert "Traceback" not in ran.stderr, ran.stderr
    return ran


def on_terminal(node: str, world: World, *args: str, as_node: str | None = None) -> tuple[int, str]:
    code, raw = on_pty(cli(node, world, args, as_node), {"PATH": f"{BIN}:/usr/bin:/bin"})
    return code, raw.decode().replace("\r\n", "\n")


def exported(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            out[name] = " ".join(shlex.split(value))
    return out


def heartbeat_etag(world: World, node: str) -> str:
    """The bookings etag in the node's next heartbeat, off the bus."""

    async def next_heartbeat() -> str:
        nc = await nats.connect(world.fleet.nats_url)
        try:
            sub = await nc.subscribe(Subjects().heartbeat(world.pools[node], node))
            return Heartbeat.from_json((await sub.next_msg(timeout=10)).data).bookings_etag
        finally:
            await nc.close()

    return asyncio.run(next_heartbeat())


def gpu_order(node: str, profile: str) -> list[str]:
    """The node's GPU UUIDs by index, as the agent itself reads them."""
    ran = subprocess.run(
        [AGENT, "inventory", "--simulate", profile, "--node-id", node, "-o", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [g["uuid"] for g in sorted(json.loads(ran.stdout)["gpus"], key=lambda g: g["index"])]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("bookings")
    with EmbeddedNats(store_dir=str(tmp / "js")) as nats:
        fleet = Fleet(tmp, nats.url)
        try:
            fleet.start_coordinator()
            op = fleet.operator()
            op.call("tenants.create", {"tenantId": "acme"})
            pools = {
                node: op.call("pools.create", {"tenantId": "acme", "name": node})["poolId"]
                for node in ("h100-a", "a100-a", "l40s-a")
            }
            w = World(fleet, tmp, pools)
            for node, profile in (("h100-a", "h100-sxm-8"), ("a100-a", "a100-mig-8"),
                                  ("l40s-a", "l40s-pcie-4")):  # fmt: skip
                w.start(node, profile)

            def registered() -> bool:
                def nodes(pool: str) -> int:
                    rows = op.call("capacity.byPool", {"tenantId": "acme", "poolId": pool})
                    return sum(r["allocatable"] for r in rows["rows"] if r["resource"] == "node")

                return all(nodes(pool) == 1 for pool in pools.values())

            wait_for(registered, timeout=60, what="3 allocatable nodes")
            yield w
        finally:
            fleet.close()


def test_env_prints_exactly_the_booked_devices_piped_and_on_a_terminal(world: World) -> None:
    made = world.book(
        "h100-a", "now", [{"class": "gpu", "count": 3}, {"class": "nic.vf", "count": 2}]
    )
    rid = made["reservationId"]
    later = world.book("h100-a", "later", [{"class": "gpu", "count": 1}],
                       start=made["start"] + 3_600_000)["reservationId"]  # fmt: skip
    wait_for(lambda: world.holds("h100-a", rid) and world.holds("h100-a", later), what="bookings")

    atoms = [a["atomId"] for a in made["atoms"]]
    gpus = {a.split(":gpu:", 1)[1] for a in atoms if ":gpu:" in a}
    vfs = sorted(a.split(":nic.vf:", 1)[1] for a in atoms if ":nic.vf:" in a)
    in_order = [u for u in gpu_order("h100-a", "h100-sxm-8") if u in gpus]
    assert len(in_order) == 3 and len(vfs) == 2

    ran = piped("h100-a", world, "env", rid)
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    assert all(line.startswith("export ") for line in ran.stdout.splitlines())
    env = exported(ran.stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(in_order)
    assert env["GPUFLEET_RESERVATION_ID"] == rid
    assert sorted(env["GPUFLEET_NIC_VFS"].split(",")) == vfs
    # What a launcher does with it: a shell sees exactly these values.
    shell = subprocess.run(["sh", "-c", ran.stdout + 'echo "$CUDA_VISIBLE_DEVICES"'],
                           capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
    assert shell.stdout.strip() == ",".join(in_order)

    code, shown = on_terminal("h100-a", world, "env", rid)
    assert code == 0 and exported(shown) == env
    assert f'eval "$(gpufleet-agent env {rid})"' in shown  # the hint, on a terminal only

    code, table = on_terminal("h100-a", world, "bookings")
    assert code == 0 and "RESERVATION" in table
    assert any(rid in line and "active" in line and "3 gpu, 2 nic.vf" in line
               for line in table.splitlines()), table  # fmt: skip
    assert any(later in line and "scheduled" in line for line in table.splitlines()), table

    # Not live on this node: a clear error, a non-zero exit, nothing on stdout.
    for other, why in ((later, "not live on node h100-a yet"), ("rsv_nope", "no booking")):
        refused = piped("h100-a", world, "env", other)
        assert refused.returncode == 3 and refused.stdout == "" and why in refused.stderr
    code, shown = on_terminal("h100-a", world, "env", later)
    assert code == 3 and "not live" in shown

    world.fleet.operator().call("reservations.release", {"tenantId": "acme", "reservationId": rid})
    wait_for(lambda: not world.holds("h100-a", rid), what="release reaches the agent")
    assert piped("h100-a", world, "env", rid).returncode == 3


def test_mig_instances_are_bound_by_their_own_uuids(world: World) -> None:
    made = world.book("a100-a", "mig", [{"class": "gpu.mig", "count": 2}])
    rid = made["reservationId"]
    wait_for(lambda: world.holds("a100-a", rid), what="MIG booking")
    migs = {a["atomId"].split(":gpu.mig:", 1)[1] for a in made["atoms"]}
    env = exported(piped("a100-a", world, "env", rid).stdout)
    assert set(env["CUDA_VISIBLE_DEVICES"].split(",")) == migs
    assert all(u.startswith("MIG-") for u in migs) and env["GPUFLEET_NIC_VFS"] == ""


def test_a_restarted_agent_is_told_again_and_nfd_names_the_whole_node_tenant(
    world: World,
) -> None:
    rid = world.book("l40s-a", "whole", [{"class": "node", "count": 1}])["reservationId"]
    wait_for(lambda: world.holds("l40s-a", rid), what="whole-node booking")
    features = world.nfd_dir("l40s-a") / "gpufleet"
    wait_for(lambda: "gpufleet.io/tenant=acme" in features.read_text(), what="NFD tenant label")
    text = features.read_text()
    assert f"gpufleet.io/pool={world.pools['l40s-a']}" in text
    assert "gpufleet.io/health=healthy" in text and "# +expiry-time=" in text
    env = exported(piped("l40s-a", world, "env", rid).stdout)
    assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 4  # the whole node's GPUs

    # The agent restarts with nothing: its first heartbeat's empty etag brings them back.
    stop(world.fleet.agents["l40s-a"])
    (world.state_dir("l40s-a") / "bookings.json").unlink()
    started = time.monotonic()
    world.start("l40s-a", "l40s-pcie-4")
    wait_for(lambda: world.holds("l40s-a", rid), what="bookings after a restart")
    assert time.monotonic() - started < 30
    # Its heartbeats now echo what it holds: the coordinator has nothing to re-send.
    etag = world.held("l40s-a")["etag"]
    wait_for(lambda: heartbeat_etag(world, "l40s-a") == etag, what="the etag echoed")


def test_a_stopped_agents_bookings_go_stale_and_another_nodes_are_refused(
    world: World,
) -> None:
    node = "a100-a"
    rid = world.book(node, "stale", [{"class": "gpu.mig", "count": 1}])["reservationId"]
    wait_for(lambda: world.holds(node, rid), what="MIG booking")
    # Nothing changes for longer than the limit (3 × 1 s + 5 s): the running agent keeps
    # confirming what it holds, so env still trusts it.
    first = world.held(node)["checkedAt"]
    time.sleep(9)
    held = world.held(node)
    assert held["checkedAt"] > first + 5000 and held["ageMs"] < 3000
    assert held["maxAgeMs"] == 8000 and held["etag"] and held["sentAt"] < held["checkedAt"]
    assert piped(node, world, "env", rid).returncode == 0

    # Released while the agent is stopped: the file still lists it, and ages.
    stop(world.fleet.agents[node])
    stopped = time.monotonic()
    world.fleet.operator().call("reservations.release", {"tenantId": "acme", "reservationId": rid})

    def refused() -> bool:
        return piped(node, world, "env", rid).returncode == 3

    wait_for(refused, timeout=30, what="env refuses the stale file")
    assert time.monotonic() - stopped < 8 + 5
    ran = piped(node, world, "env", rid)
    assert ran.stdout == "" and "last confirmed by the agent" in ran.stderr
    assert "longer than the 8.0 s allowed (--max-age)" in ran.stderr
    code, shown = on_terminal(node, world, "env", rid)
    assert code == 3 and "is the agent running" in shown and "export" not in shown
    # What --max-age allows, the operator asked for (the file still holds the booking).
    assert piped(node, world, "env", rid, "--max-age", "3600").returncode == 0
    listed = piped(node, world, "bookings")
    assert listed.returncode == 0 and "warning: the bookings in" in listed.stderr
    assert "confirmed " in listed.stdout.splitlines()[0] and rid in listed.stdout

    # The file of another host (a copied state dir, a wrong --node-id): exit 2, both named.
    ran = piped(node, world, "env", rid, "--max-age", "3600", as_node="other-host")
    assert ran.returncode == 2 and ran.stdout == ""
    assert "bookings of node a100-a, and this host is node other-host" in ran.stderr
    code, shown = on_terminal(node, world, "bookings", as_node="other-host")
    assert code == 2 and "this host is node other-host" in shown

    # Started again, the agent is told the release; env says why, not a stale error.
    world.start(node, "a100-mig-8")
    wait_for(lambda: not world.holds(node, rid), what="the release reaches the agent")
    ran = piped(node, world, "env", rid)
    assert ran.returncode == 3 and "has no booking on node a100-a" in ran.stderr
