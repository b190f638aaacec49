"""NATS JWT `.creds` files (decentralised auth, as `nsc` makes them), which the agent's and
the coordinator's `--help` offer: both connected with them only if nats-py had its
`nkeys` extra, and crashed at connect (`ModuleNotFoundError: nkeys`) without it.

A real nats-server in operator mode (a memory resolver with the account preloaded) and
real agent and coordinator processes' code paths; the operator, account and user JWTs are
minted here with `nkeys`, each user with the permissions `gpufleet nats-auth` gives its
role, as docs/operator.md tells JWT users to do."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import nkeys
import pytest

from agent.config import Settings
from agent.main import run as run_agent
from coordinator.app import running_coordinator
from coordinator.bus.connection import Bus
from ops.kit.embedded_nats import EmbeddedNats
from ops.kit.nats_users import AgentNode, Permissions, agent_permissions, coordinator_permissions
from procs.nats import NatsSettings
from shared.ids import new_pool_id
from shared.streams import stream_name
from shared.subjects import Subjects
from tests.integration.conftest import Api, coordinator_settings
from tests.waiting import eventually

PREFIX = "tjwt"
POOL = new_pool_id()
NODE = AgentNode(POOL, "gpu-jwt.rack1")


@dataclass(frozen=True)
class Key:
    seed: bytes
    public: str

    @classmethod
    def new(cls, prefix: int) -> Key:
        seed = nkeys.encode_seed(secrets.token_bytes(32), prefix)
        return cls(seed, nkeys.from_seed(seed).public_key.decode())

    def sign(self, data: bytes) -> bytes:
        return bytes(nkeys.from_seed(bytearray(self.seed)).sign(data))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint(issuer: Key, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A NATS JWT (v2 claims) for `subject`, signed by `issuer`."""
    header = {"typ": "JWT", "alg": "ed25519-nkey"}
    claims = {
        "jti": secrets.token_hex(16).upper(),
        "iat": int(time.time()),
        "iss": issuer.public,
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
    }
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def user_claims(perms: Permissions) -> dict[str, Any]:
    claims: dict[str, Any] = {
        "type": "user",
        "pub": {"allow": list(perms.publish)},
        "sub": {"allow": list(perms.subscribe)},
        "subs": -1,
        "data": -1,
        "payload": -1,
    }
    if perms.allow_responses:
        claims["resp"] = {"max": 1, "ttl": 0}
    return claims


def creds_file(path: Path, jwt: str, seed: bytes) -> Path:
    """The layout `nsc generate creds` writes."""
    path.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed.decode()}\n"
        "------END USER NKEY SEED------\n"
    )
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class OperatorMode:
    server: EmbeddedNats
    coordinator_creds: Path
    agent_creds: Path


@pytest.fixture(scope="module")
def operator_mode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorMode]:
    out = tmp_path_factory.mktemp("nats-jwt")
    operator = Key.new(nkeys.PREFIX_BYTE_OPERATOR)
    account = Key.new(nkeys.PREFIX_BYTE_ACCOUNT)
    # JetStream will not start in operator mode without a system account.
    system = Key.new(nkeys.PREFIX_BYTE_ACCOUNT)
    operator_jwt = mint(
        operator,
        operator.public,
        "gpufleet-test",
        {"type": "operator", "system_account": system.public},
    )
    system_jwt = mint(operator, system.public, "SYS", {"type": "account"})
    unlimited = ("subs", "conn", "leaf", "imports", "exports", "data", "payload")
    # JetStream (the alert stream) needs storage limits on the account.
    jetstream = ("mem_storage", "disk_storage", "streams", "consumer")
    account_jwt = mint(
        operator,
        account.public,
        "gpufleet",
        {
            "type": "account",
            "limits": {**dict.fromkeys(unlimited + jetstream, -1), "wildcards": True},
        },
    )
    subjects = Subjects(PREFIX)
    users = {}
    for name, perms in (
        ("coordinator", coordinator_permissions(subjects)),
        ("agent", agent_permissions(subjects, NODE)),
    ):
        user = Key.new(nkeys.PREFIX_BYTE_USER)
        jwt = mint(account, user.public, name, user_claims(perms))
        users[name] = creds_file(out / f"{name}.creds", jwt, user.seed)
    (out / "operator.jwt").write_text(operator_jwt)
    config = out / "nats-server.conf"
    config.write_text(
        f'operator: "{out / "operator.jwt"}"\n'
        f"system_account: {system.public}\n"
        "resolver: MEMORY\n"
        "resolver_preload: {\n"
        f'  {account.public}: "{account_jwt}"\n'
        f'  {system.public}: "{system_jwt}"\n'
        "}\n"
    )
    with EmbeddedNats(config_file=str(config)) as server:
        yield OperatorMode(server, users["coordinator"], users["agent"])


async def test_the_bus_connects_with_a_jwt_creds_file_and_the_server_holds_it_to_its_claims(
    operator_mode: OperatorMode,
) -> None:
    bus = Bus(
        NatsSettings(url=operator_mode.server.url, credentials=str(operator_mode.agent_creds))
    )
    await bus.connect(attempts=1)
    try:
        assert bus.auth_required  # operator mode demands credentials
        # The agent's JWT, like its nats-auth user, may not speak for another node.
        await bus.publish(Subjects(PREFIX).heartbeat(POOL, "someone-else"), b"{}")
        await bus.flush()

        async def refused() -> bool:
            return bus.errors.get("permissions", 0) == 1

        await eventually(refused, within_s=5)
    finally:
        await bus.close()


async def test_a_real_agent_and_coordinator_work_on_jwt_creds(
    operator_mode: OperatorMode, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The coordinator (JetStream alert stream, its subscriptions) and an agent, each on
    its own `.creds` file, against an operator-mode nats-server: the agent's inventory
    reaches the coordinator, which then accepts an operator act on the node. Both stop
    cleanly when told: no shutdown step of the coordinator overruns, and the agent
    returns 0 within its grace."""
    settings = coordinator_settings(
        f"sqlite:///{tmp_path / 'ledger.db'}",
        operator_mode.server.url,
        nats_credentials=str(operator_mode.coordinator_creds),
        subject_prefix=PREFIX,
        insecure_bus=False,
    )
    stop = asyncio.Event()
    agent_task: asyncio.Task[int] | None = None
    try:
        async with running_coordinator(settings) as c:
            now = int(time.time() * 1000)
            await c.ledger.tenants.create("acme", "Acme", now)
            await c.ledger.pools.create(POOL, "jwt", "acme", None, now)
            agent = Settings(
                pool_id=POOL,
                node_id=NODE.node_id,
                nats=NatsSettings(
                    url=operator_mode.server.url,
                    credentials=str(operator_mode.agent_creds),
                    subject_prefix=PREFIX,
                ),
                simulate="l40s-pcie-4",
                interval_s=1.0,
            )
            agent_task = asyncio.create_task(run_agent(agent, stop, install_signals=False))
            key = settings.bootstrap_operator_key
            assert key
            async with aiohttp.ClientSession() as session:
                api = Api(session, c.url, key)
                await api.maintenance_once_registered(NODE.node_id, "jwt test")

            # The alert stream was made by the coordinator's JWT user, and holds the act.
            creds = str(operator_mode.coordinator_creds)
            bus = Bus(NatsSettings(url=operator_mode.server.url, credentials=creds))
            await bus.connect(attempts=1)
            try:
                js = bus.jetstream(timeout_s=5)

                async def stored() -> bool:
                    info = await js.stream_info(stream_name(PREFIX))
                    return info.state.messages >= 2  # node.registered, node.maintenance

                await eventually(stored)
            finally:
                await bus.close()
        overran = [r.getMessage() for r in caplog.records if "shutdown:" in r.getMessage()]
        assert not overran, overran
    finally:
        stop.set()
        if agent_task is not None:
            await _stopped(agent_task)


# Backstop far above the measured worst case (0.1 s): the agent's loops end within a
# second of the stop (tests/integration/agent/test_stops.py).
AGENT_STOP_GRACE_S = 15.0


async def _stopped(agent: asyncio.Task[int]) -> None:
    done, _ = await asyncio.wait({agent}, timeout=AGENT_STOP_GRACE_S)
    if not done:
        agent.cancel()
        await asyncio.wait({agent}, timeout=AGENT_STOP_GRACE_S)
        raise AssertionError(f"the agent did not stop within {AGENT_STOP_GRACE_S:.0f} s")
    assert agent.result() == 0
