"""The simulated fleet the benchmarks share: 8-GPU nodes as an agent reports them, and
a throwaway PostgreSQL database when the local server is reachable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from shared.wire import Atom, Inventory, NodeHealth, Scalars

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


def node_id(i: int) -> str:
    return f"node-{i:05d}"


def inventory(i: int, pool: str, gpus: int = 8) -> Inventory:
    node = node_id(i)
    atoms = [Atom(atom_id=f"{node}:node", cls="node")]
    atoms += [
        Atom(
            atom_id=f"{node}:gpu:{g}",
            cls="gpu",
            device_id=f"GPU-{pool[-6:]}-{i}-{g}",
            attrs={"model": "H100", "nvlinkClique": "nvl0"},
        )
        for g in range(gpus)
    ]
    return Inventory(
        node_id=node, pool_id=pool, boot_id="b", sent_at=0, inventory_hash=f"hash-{i}",
        labels={"rack": f"r{i // 32}"}, scalars=Scalars(vcpu=128, memory_gib=1024),
        atoms=tuple(atoms), health=NodeHealth(status="healthy"),
    )  # fmt: skip


async def postgres_reachable() -> bool:
    try:
        import asyncpg

        conn = await asyncio.wait_for(asyncpg.connect(PG_ADMIN), timeout=3)
    except Exception:
        return False
    await conn.close()
    return True


@asynccontextmanager
async def postgres_database(tag: str) -> AsyncIterator[str]:
    """A fresh database on the local PostgreSQL, dropped afterwards."""
    import asyncpg

    name = f"gpufleet_bench_{tag}_{time.time_ns()}"
    conn = await asyncpg.connect(PG_ADMIN)
    await conn.execute(f"CREATE DATABASE {name}")
    await conn.close()
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    finally:
        conn = await asyncpg.connect(PG_ADMIN)
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await conn.close()
