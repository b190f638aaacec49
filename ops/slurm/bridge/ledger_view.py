"""The ledger as the bridge reads it: every live or scheduled reservation
(`reservations.list`) and every node with its state flags (`nodes.list`; for a degraded
or unhealthy one also which of its GPUs are unhealthy, from `nodes.get`), over the
coordinator's HTTP API with an operator key (it names no tenant, so it sees them all),
a page at a time. The answers are decoded by msgspec models of just the fields used;
anything else in them is ignored, so a newer coordinator reads the same."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import msgspec

from ops.kit.async_client import AsyncApiClient
from ops.slurm.bridge.model import Ledger, LedgerNode, LedgerReservation
from shared.reservation_states import LIVE_STATES

_GPU = "gpu"
_MIG = "gpu.mig"
_MAY_HAVE_UNHEALTHY_GPUS = ("degraded", "unhealthy")


class _Atom(msgspec.Struct, rename="camel"):
    node_id: str
    cls: str = msgspec.field(name="class")
    atom_id: str = ""


class _AtomDetail(msgspec.Struct, rename="camel"):
    atom_id: str
    cls: str = msgspec.field(name="class")
    attrs: dict[str, Any] = msgspec.field(default_factory=dict)
    device_id: str = ""
    health: str = "healthy"
    health_reasons: list[str] = msgspec.field(default_factory=list)


class _NodeDetail(msgspec.Struct, rename="camel"):
    atoms: list[_AtomDetail]


class _Reservation(msgspec.Struct, rename="camel"):
    reservation_id: str
    tenant_id: str
    pool_id: str
    state: str
    start: int
    end: int
    atoms: list[_Atom]
    binding: str = "hold"
    preempt_at: int | None = None
    lease_expires_at: int | None = None


class _ReservationPage(msgspec.Struct, rename="camel"):
    reservations: list[_Reservation]
    next_cursor: str | None = None


class _Flag(msgspec.Struct):
    value: Any
    reason: str = ""
    reasons: list[str] = msgspec.field(default_factory=list)
    since: int | None = None


class _Flags(msgspec.Struct):
    reachable: _Flag
    health: _Flag
    maintenance: _Flag


class _Node(msgspec.Struct, rename="camel"):
    node_id: str
    pool_id: str
    state: _Flags


class _NodePage(msgspec.Struct, rename="camel"):
    nodes: list[_Node]
    next_cursor: str | None = None


def reservation(r: _Reservation, profiles: Mapping[str, str]) -> LedgerReservation:
    """`profiles`: the MIG profile of each MIG atom (`nodes.get`), for their gres type."""
    gpus: dict[str, int] = {}
    mig: dict[str, dict[str, int]] = {}
    for atom in r.atoms:
        if atom.cls == _GPU:
            gpus[atom.node_id] = gpus.get(atom.node_id, 0) + 1
        elif atom.cls == _MIG and atom.atom_id in profiles:
            on_node = mig.setdefault(atom.node_id, {})
            on_node[profiles[atom.atom_id]] = on_node.get(profiles[atom.atom_id], 0) + 1
    return LedgerReservation(
        reservation_id=r.reservation_id, tenant_id=r.tenant_id, pool_id=r.pool_id,
        state=r.state, start_ms=r.start, end_ms=r.end, binding=r.binding,
        nodes=frozenset(a.node_id for a in r.atoms), gpus=gpus, mig=mig,
        preempt_at_ms=r.preempt_at,
        classes=frozenset(a.cls for a in r.atoms),
        lease_expires_at_ms=r.lease_expires_at,
    )  # fmt: skip


def node(n: _Node, unhealthy_gpus: tuple[str, ...] = ()) -> LedgerNode:
    s = n.state
    return LedgerNode(
        node_id=n.node_id, pool_id=n.pool_id, reachable=bool(s.reachable.value),
        health=str(s.health.value), health_reasons=tuple(s.health.reasons),
        maintenance=bool(s.maintenance.value), maintenance_reason=s.maintenance.reason,
        unhealthy_gpus=unhealthy_gpus, reachable_since_ms=s.reachable.since,
    )  # fmt: skip


def unhealthy_gpus(atoms: list[_AtomDetail]) -> tuple[str, ...]:
    """`GPU<index> <first reason>` per unhealthy GPU (its MIG instances and time-slice
    slots are one GPU), by index."""
    out: dict[tuple[int, str], str] = {}
    for atom in atoms:
        if not atom.cls.startswith(_GPU) or atom.health != "unhealthy":
            continue
        index = atom.attrs.get("gpuIndex", atom.attrs.get("index"))
        key = (index, "") if isinstance(index, int) else (1 << 30, atom.device_id)
        name = f"GPU{index}" if isinstance(index, int) else f"GPU {atom.device_id}"
        why = atom.health_reasons[0] if atom.health_reasons else "unhealthy"
        out.setdefault(key, f"{name} {why}")
    return tuple(out[k] for k in sorted(out))


class LedgerView:
    """Reads fail with `ops.kit.client.ClientError` (unreachable, refused, not its answer)."""

    def __init__(
        self, http: aiohttp.ClientSession, base_url: str, key: str, page: int = 200,
        *, insecure_http: bool = False,
    ) -> None:  # fmt: skip
        self.api = AsyncApiClient(http, base_url, key, insecure_http=insecure_http)
        self.page = page  # reservations a call (nodes: five times as many)

    async def _mig_profiles(self, nodes: set[str]) -> dict[str, str]:
        """atom id -> MIG profile, for the nodes with booked MIG instances (a listing
        names no atom's attributes; a node's detail does)."""
        out: dict[str, str] = {}
        for node_id in sorted(nodes):
            detail = await self.api.call("nodes.get", {"nodeId": node_id}, _NodeDetail)
            for atom in detail.atoms:
                profile = atom.attrs.get("profile")
                if atom.cls == _MIG and isinstance(profile, str):
                    out[atom.atom_id] = profile
        return out

    async def read(self) -> Ledger:
        """Both lists; `at_ms` is taken before reading, so whatever changed while they
        were read is newer than the snapshot and triggers the next reconcile."""
        at_ms = int(time.time() * 1000)
        body = {"state": list(LIVE_STATES), "limit": self.page}
        pages = await self.api.pages("reservations.list", body, _ReservationPage)
        listed = [r for p in pages for r in p.reservations]
        profiles = await self._mig_profiles({a.node_id for r in listed for a in r.atoms
                                             if a.cls == _MIG})  # fmt: skip
        reservations = tuple(reservation(r, profiles) for r in listed)
        node_pages = await self.api.pages("nodes.list", {"limit": 5 * self.page}, _NodePage)
        listed_nodes = [n for p in node_pages for n in p.nodes]
        nodes = []
        for n in listed_nodes:
            gpus: tuple[str, ...] = ()
            if n.state.health.value in _MAY_HAVE_UNHEALTHY_GPUS:
                # Only a node's detail says which GPUs are unhealthy: few nodes at a time.
                detail = await self.api.call("nodes.get", {"nodeId": n.node_id}, _NodeDetail)
                gpus = unhealthy_gpus(detail.atoms)
            nodes.append(node(n, gpus))
        return Ledger(reservations, tuple(nodes), at_ms)
