"""What the `gpufleet` end-to-end tests share: the fleet they run against (`World`: a
coordinator, its agents and NATS, two tenants, a booking; `running_fleet` and
`two_tenants` set it up) and running the real command in it, piped (`piped`, `json_of`
for its JSON answer) or on a pty (`on_terminal`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.kit.client import ApiClient
from ops.kit.embedded_nats import EmbeddedNats
from tests.e2e.fleet_procs import Fleet
from tests.terminal import on_pty

BIN = Path(sys.executable).parent
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class World:
    fleet: Fleet
    nats_url: str
    h100: str
    mixed: str
    acme_key: str
    globex_key: str
    reservation: str
    tmp: Path

    def env(self, key: str | None = None) -> dict[str, str]:
        return {
            "PATH": f"{BIN}:/usr/bin:/bin",
            "GPUFLEET_URL": self.fleet.url,
            "GPUFLEET_KEY": key or self.fleet.operator_key,
            "GPUFLEET_NATS_URL": self.nats_url,
            "COLUMNS": "250",
            "HOME": str(self.tmp),
        }


@dataclass
class Ran:
    code: int
    out: str
    err: str


def piped(
    world: World, *args: str, key: str | None = None, env: dict[str, str] | None = None
) -> Ran:
    p = subprocess.run(
        [str(BIN / "gpufleet"), *args], capture_output=True, text=True, timeout=60,
        env=world.env(key) | (env or {}),
    )  # fmt: skip
    assert "Traceback" not in p.stderr, p.stderr
    return Ran(p.returncode, p.stdout, p.stderr)


def json_of(world: World, *args: str, key: str | None = None) -> Any:
    """The command's answer piped, as JSON (which it prints when piped); it must succeed."""
    ran = piped(world, *args, key=key)
    assert ran.code == 0, (args, ran.err)
    return json.loads(ran.out)


def on_terminal(world: World, *args: str, key: str | None = None) -> Ran:
    """Run with stdout and stderr on a pseudo-terminal, as a person would."""
    code, raw = terminal_bytes(world, *args, key=key)
    text = ANSI.sub("", raw.decode(errors="replace")).replace("\r\n", "\n")
    assert "Traceback" not in text, text
    return Ran(code, text, "")


def terminal_bytes(world: World, *args: str, key: str | None = None) -> tuple[int, bytes]:
    """The exit status and every byte the terminal received, escapes included."""
    return on_pty([str(BIN / "gpufleet"), *args], world.env(key))


@dataclass(frozen=True)
class Tenancy:
    """Tenants acme and globex with an API key each (acme's labelled `ci`), acme's pools
    `h100-east` (gpuModel H100) and `mixed`, the latter offered to globex."""

    op: ApiClient
    h100: str
    mixed: str
    acme_key: str
    globex_key: str

    def booked(self, fleet: Fleet, nats_url: str, tmp: Path, key: str) -> World:
        """The world, once acme has booked 2 of h100-east's GPUs for an hour (`key`:
        the idempotency key)."""
        booked = self.op.call("reservations.create", {
            "tenantId": "acme", "poolId": self.h100, "devices": [{"class": "gpu", "count": 2}],
            "duration": "1h", "idempotencyKey": key,
        })  # fmt: skip
        return World(fleet, nats_url, self.h100, self.mixed, self.acme_key, self.globex_key,
                     booked["reservationId"], tmp)  # fmt: skip


@contextmanager
def running_fleet(tmp: Path, *coordinator_args: str) -> Iterator[tuple[Fleet, str]]:
    """NATS and a coordinator started with `coordinator_args` in `tmp`: the fleet (for
    agents to join) and NATS's URL; all stopped after."""
    with EmbeddedNats(store_dir=str(tmp / "js")) as nats:
        fleet = Fleet(tmp, nats.url)
        try:
            fleet.start_coordinator(*coordinator_args)
            yield fleet, nats.url
        finally:
            fleet.close()


def two_tenants(fleet: Fleet) -> Tenancy:
    op = fleet.operator()
    for tenant in ("acme", "globex"):
        op.call("tenants.create", {"tenantId": tenant})
    h100 = op.call("pools.create", {"tenantId": "acme", "name": "h100-east",
                                    "gpuModel": "H100"})["poolId"]  # fmt: skip
    mixed = op.call("pools.create", {"tenantId": "acme", "name": "mixed"})["poolId"]
    op.call("pools.offer", {"tenantId": "acme", "poolId": mixed, "offerTo": "globex"})
    acme = op.call("apiKeys.create", {"tenantId": "acme", "label": "ci"})["key"]
    globex = op.call("apiKeys.create", {"tenantId": "globex"})["key"]
    return Tenancy(op, h100, mixed, acme, globex)
