"""Pure planning: the Slurm state the ledger asks for (`desired`) and the actions that
take Slurm from what it shows to that (`plan`).

Ownership is by name and reason only: a reservation named `gpufleet-*` and a drain
whose reason starts with `gpufleet:` are the bridge's; nothing else is ever in a plan.
A node the ledger wants drained that someone else already drained keeps that drain and
its reason (it is drained either way), and is never resumed by the bridge.

Applying a plan and planning again gives no action (tests/unit/ops/slurm/test_planner.py
holds it for any Slurm state): the planner compares what it would set, normalised as
Slurm shows it, never what Slurm adds (cpu counts, flags).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from ops.slurm.bridge.model import (
    DRAIN_CAUSES,
    DRAIN_PREFIX,
    RESERVATION_PREFIX,
    Action,
    CreateQos,
    CreateReservation,
    DeleteQos,
    DeleteReservation,
    Drain,
    DrainCause,
    GpuTres,
    Ledger,
    LedgerNode,
    LedgerReservation,
    Resume,
    SlurmQos,
    SlurmReservation,
    SlurmState,
    UpdateQos,
    UpdateReservation,
)
from shared.reservation_states import LIVE_STATES
from shared.slurm_gres import token

# What Slurm schedules: a booking of only NICs or disks is no Slurm reservation (it would
# hold the whole node from jobs that never touch them).
SLURM_CLASSES = frozenset({"gpu", "gpu.mig", "gpu.slot", "node"})
# Slurm keeps a node's reason in a fixed buffer; longer ones are cut by the bridge, so
# what it compares is what Slurm stores.
MAX_REASON = 200
# C0 and C1 control characters (and DEL): never in what the bridge hands Slurm, whatever
# an agent or operator wrote (Slurm shows reasons in sinfo and logs).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# An agent restart or a rolling upgrade makes a node unreachable for a few heartbeats:
# that drains nothing; a node still unreachable after this is drained.
UNREACHABLE_GRACE_S = 120.0


@dataclass(frozen=True)
class Policy:
    """What the bridge's settings say about the mapping (see `BridgeSettings`)."""

    accounts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    users: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    default_accounts: tuple[str, ...] = ()
    default_users: tuple[str, ...] = ()
    gpu_tres: GpuTres = "typed"
    node_names: Mapping[str, str] = field(default_factory=dict)
    drain_on: Collection[DrainCause] = DRAIN_CAUSES
    pools: Collection[str] = ()  # empty: every pool
    unreachable_grace_s: float = UNREACHABLE_GRACE_S

    def slurm_node(self, node_id: str) -> str:
        return self.node_names.get(node_id, node_id)

    def follows(self, pool_id: str) -> bool:
        return not self.pools or pool_id in self.pools


@dataclass(frozen=True)
class Desired:
    reservations: Mapping[str, SlurmReservation]
    drains: Mapping[str, str]  # Slurm node -> reason
    unknown_nodes: frozenset[str]  # nodes the ledger wants something of, Slurm lacks
    unmapped: frozenset[str]  # reservations left out: their tenant has no user/account
    # Reservations kept as Slurm has them: a node of theirs is missing from Slurm's
    # listing (a renamed node, a node_names typo); deleting would drop the protection.
    kept: frozenset[str] = frozenset()
    # When a node now unreachable within its grace period would be drained (epoch ms):
    # the bridge passes again then, whether or not anything else happens.
    recheck_at_ms: int | None = None
    # Each booking's QOS (by lower-cased name, as sacctmgr keeps it), and those of kept
    # reservations (left as they are).
    qos: Mapping[str, SlurmQos] = field(default_factory=dict)
    qos_kept: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    desired: Desired
    left_alone: frozenset[str] = frozenset()  # nodes drained by someone else


def reservation_name(reservation_id: str) -> str:
    return RESERVATION_PREFIX + reservation_id


def qos_name(reservation_id: str) -> str:
    """The booking's QOS: its reservation's name, lower case (sacctmgr lowers QOS
    names; slurmctld matches a job's QOS without regard to case)."""
    return reservation_name(reservation_id).lower()


def drain_reason(
    node: LedgerNode,
    drain_on: Collection[DrainCause],
    now_ms: int = 0,
    unreachable_grace_s: float = 0.0,
) -> str | None:
    """`gpufleet: <cause>[: <why>]`, the strongest cause first as in the rollup
    (unreachable > maintenance > unhealthy); None when the node should run jobs.

    Unhealthy is a node unhealthy or unmonitored, or one with any unhealthy GPU (its
    health then `degraded`: Slurm 22.05 cannot take one GPU out of a node, so the node
    goes). Unreachable counts once it has lasted `unreachable_grace_s`."""
    causes: list[tuple[DrainCause, str]] = []
    since = node.reachable_since_ms
    if not node.reachable and (since is None or now_ms - since >= unreachable_grace_s * 1000):
        causes.append(("unreachable", ""))
    if node.maintenance:
        causes.append(("maintenance", node.maintenance_reason))
    if node.unhealthy_gpus and node.health != "unmonitored":
        causes.append(("unhealthy", ", ".join(node.unhealthy_gpus)))
    elif node.health in ("unhealthy", "unmonitored"):
        causes.append(("unhealthy", ", ".join(node.health_reasons) or node.health))
    for cause, why in causes:
        if cause in drain_on:
            text = _CONTROL.sub(" ", f"{DRAIN_PREFIX} {cause}" + (f": {why}" if why else ""))
            return " ".join(text.split())[:MAX_REASON]  # one line, as Slurm keeps it
    return None


def _gpu_counts(
    rsv: LedgerReservation, policy: Policy, state: SlurmState, typed: bool
) -> dict[str, int]:
    """The booking's whole GPUs by the node's GPU type and MIG instances by the type
    `gpufleet slurm conf` gives their profile on that node (`<model>_<profile>`), as
    gres TRES names (`gres/gpu` alone when not `typed` or the node's GPUs have none)."""
    per_type: dict[str, int] = {}
    for node_id, count in rsv.gpus.items():
        slurm_node = state.nodes.get(policy.slurm_node(node_id))
        if slurm_node is None or count <= 0:
            continue
        # `gpufleet slurm conf` names MIG instances `<model>_<profile>`: whole GPUs are
        # the type without one.
        types = [t for t in slurm_node.gpu_types if "_" not in t] or slurm_node.gpu_types
        key = f"gres/gpu:{types[0]}" if typed and types else "gres/gpu"
        per_type[key] = per_type.get(key, 0) + count
    for node_id, by_profile in rsv.mig.items():
        slurm_node = state.nodes.get(policy.slurm_node(node_id))
        if slurm_node is None:
            continue
        for profile, count in by_profile.items():
            suffix = "_" + token(profile).lower()
            kind = next((t for t in slurm_node.gpu_types if t.endswith(suffix)), None)
            if kind is None:
                continue  # Slurm has no such type there: not expressible, left out
            key = f"gres/gpu:{kind}" if typed else "gres/gpu"
            per_type[key] = per_type.get(key, 0) + count
    return per_type


def _joined(counts: Mapping[str, int]) -> str:
    return normalise_tres(",".join(f"{k}={v}" for k, v in counts.items()))


def _tres(rsv: LedgerReservation, policy: Policy, state: SlurmState) -> str:
    """The gres part of the reservation's TRES; empty for whole nodes (binding node, no
    GPUs, or TRES off), which Slurm then reserves entirely."""
    if policy.gpu_tres in ("off", "cores") or rsv.binding == "node":
        return ""
    return _joined(_gpu_counts(rsv, policy, state, typed=policy.gpu_tres == "typed"))


def qos_tres(rsv: LedgerReservation, policy: Policy, state: SlurmState) -> str:
    """A booking QOS's GrpTRES: every booked GPU and MIG instance by type, and their
    total as `gres/gpu` (a job asking `--gres=gpu:n` without a type counts only
    there). A QOS is job-wide: the booking's total, whatever its nodes; its reservation
    places them. Empty (no cap) when it books no GPU Slurm can count."""
    typed = _gpu_counts(rsv, policy, state, typed=True)
    total = sum(typed.values())
    if not total:
        return ""
    return _joined({k: v for k, v in typed.items() if k != "gres/gpu"} | {"gres/gpu": total})


def node_reservation_name(reservation_id: str, slurm_node: str) -> str:
    """One node's part of a booking reserved node by node (`_per_node_tres`)."""
    return f"{reservation_name(reservation_id)}--{slurm_node}"


def _per_node_tres(
    rsv: LedgerReservation, nodes: Collection[str], policy: Policy, state: SlurmState
) -> dict[str, str]:
    """GRES TRES on several nodes that differ per node (4 GPUs on one, 2 on another):
    Slurm would spread one total its own way, so each node gets a reservation of its
    own with its own TRES; {} when one reservation holds it as booked."""
    if policy.gpu_tres not in ("typed", "count") or rsv.binding == "node" or len(nodes) < 2:
        return {}
    per_node: dict[str, str] = {}
    for node_id in sorted(rsv.nodes):
        name = policy.slurm_node(node_id)
        if name not in nodes:
            continue
        gpus = {k: v for k, v in rsv.gpus.items() if k == node_id}
        mig = {k: v for k, v in rsv.mig.items() if k == node_id}
        one = replace(rsv, nodes=frozenset({node_id}), gpus=gpus, mig=mig)
        per_node[name] = _tres(one, policy, state)
    if len(set(per_node.values())) < 2:
        return {}
    return per_node


def _cores(
    rsv: LedgerReservation, nodes: Collection[str], policy: Policy, state: SlurmState
) -> tuple[tuple[str, int], ...]:
    """ "cores" mode: per Slurm node, the cores of the booked GPUs (their count times the
    node's cores per GPU); empty (the nodes whole) when any node lacks a socket per GPU,
    or the booking holds MIG instances or the whole node."""
    if policy.gpu_tres != "cores" or rsv.binding == "node" or rsv.mig:
        return ()
    per_node: dict[str, int] = {}
    for node_id, count in rsv.gpus.items():
        name = policy.slurm_node(node_id)
        if name in nodes and count > 0:
            per_node[name] = per_node.get(name, 0) + count * state.nodes[name].cores_per_gpu
    if set(per_node) != set(nodes) or not all(per_node.values()):
        return ()
    return tuple(sorted(per_node.items()))


def normalise_tres(tres: str) -> str:
    """The gres items of a TRES string, lower case, sorted (`cpu=…` dropped)."""
    items = [t.strip().lower() for t in tres.split(",") if t.strip()]
    return ",".join(sorted(t for t in items if t.startswith("gres/")))


def desired(ledger: Ledger, state: SlurmState, policy: Policy) -> Desired:
    now_s = ledger.at_ms // 1000
    unknown: set[str] = set()
    unmapped: set[str] = set()
    kept: set[str] = set()
    qos_kept: set[str] = set()
    qos: dict[str, SlurmQos] = {}
    reservations: dict[str, SlurmReservation] = {}
    for rsv in ledger.reservations:
        if rsv.state not in LIVE_STATES or not policy.follows(rsv.pool_id):
            continue
        if rsv.binding != "node" and not rsv.classes & SLURM_CLASSES:
            continue
        end_s = -(-rsv.ends_ms // 1000)
        if end_s <= now_s:
            continue
        nodes: set[str] = set()
        missing: set[str] = set()
        for node_id in rsv.nodes:
            name = policy.slurm_node(node_id)
            (nodes if name in state.nodes else missing).add(name)
        unknown |= missing
        base_name = reservation_name(rsv.reservation_id)
        mine = {n for n in state.reservations if n == base_name or n.startswith(base_name + "--")}
        if missing and mine:
            kept |= mine
            qos_kept.add(qos_name(rsv.reservation_id))
            continue
        if not nodes:
            continue
        users = policy.users.get(rsv.tenant_id, policy.default_users)
        accounts = policy.accounts.get(rsv.tenant_id, policy.default_accounts)
        if not users and not accounts:
            unmapped.add(rsv.reservation_id)
            continue
        name = reservation_name(rsv.reservation_id)
        cores = _cores(rsv, nodes, policy, state)
        base = SlurmReservation(
            name=name,
            nodes=frozenset(nodes),
            start_s=rsv.start_ms // 1000,
            end_s=end_s,
            tres=_tres(rsv, policy, state),
            users=frozenset(users),
            accounts=frozenset(accounts),
            cores=cores,
            core_total=sum(n for _, n in cores),
        )
        booking_qos = qos_name(rsv.reservation_id)
        qos[booking_qos] = SlurmQos(
            booking_qos, qos_tres(rsv, policy, state), users=frozenset(users),
            accounts=frozenset(accounts),
        )  # fmt: skip
        split = _per_node_tres(rsv, nodes, policy, state)
        if not split:
            reservations[name] = base
        for node_name, tres in split.items():
            part = node_reservation_name(rsv.reservation_id, node_name)
            reservations[part] = replace(base, name=part, nodes=frozenset({node_name}), tres=tres)
    drains: dict[str, str] = {}
    grace_ms = int(policy.unreachable_grace_s * 1000)
    recheck: list[int] = []
    for node in ledger.nodes:
        if not policy.follows(node.pool_id):
            continue
        since = node.reachable_since_ms
        if not node.reachable and since is not None and since + grace_ms > ledger.at_ms:
            recheck.append(since + grace_ms)
        reason = drain_reason(node, policy.drain_on, ledger.at_ms, policy.unreachable_grace_s)
        if reason is None:
            continue
        name = policy.slurm_node(node.node_id)
        if name in state.nodes:
            drains[name] = reason
        else:
            unknown.add(name)
    return Desired(
        reservations, drains, frozenset(unknown), frozenset(unmapped), frozenset(kept),
        min(recheck, default=None), qos, frozenset(qos_kept),
    )  # fmt: skip


def _changes(want: SlurmReservation, have: SlurmReservation, now_s: int) -> tuple[str, ...]:
    changed = []
    if want.nodes != have.nodes:
        changed.append("nodes")
    # Both started: Slurm cannot move a start into the past, and need not.
    started = want.start_s <= now_s and have.start_s <= now_s
    if want.start_s != have.start_s and not started:
        changed.append("start")
    if want.end_s != have.end_s:
        changed.append("end")
    if want.tres != normalise_tres(have.tres):
        changed.append("tres")
    # Slurm shows a reservation's core total (a whole node's too): compared when cores
    # are what is reserved.
    if want.core_total and want.core_total != have.core_total:
        changed.append("cores")
    if want.users != have.users:
        changed.append("users")
    if want.accounts != have.accounts:
        changed.append("accounts")
    return tuple(changed)


def plan(ledger: Ledger, state: SlurmState, policy: Policy) -> Plan:
    """The actions that make Slurm's gpufleet objects what the ledger says: creates and
    updates in the ledger's order, deletes and resumes after drains (a node leaving
    gpufleet's drain never opens before a new one closes it)."""
    want = desired(ledger, state, policy)
    now_s = ledger.at_ms // 1000
    qos_first, qos_last = _plan_qos(want, state)
    actions: list[Action] = list(qos_first)
    for name, rsv in want.reservations.items():
        have = state.reservations.get(name)
        if have is None:
            actions.append(CreateReservation(rsv))
        elif changed := _changes(rsv, have, now_s):
            if (
                ("tres" in changed and not rsv.tres)
                or "cores" in changed
                or ("nodes" in changed and rsv.cores)
            ):
                # Slurm cannot drop a reservation's TRES, nor be told which cores: it is
                # made again.
                actions += [DeleteReservation(name), CreateReservation(rsv)]
            else:
                actions.append(UpdateReservation(rsv, changed))
    left_alone: set[str] = set()
    for node_name, reason in want.drains.items():
        node = state.nodes[node_name]
        if node.drained and not node.drained_by_gpufleet:
            left_alone.add(node_name)  # someone else's drain: it stays as they set it
        elif not node.drained or node.reason != reason:
            actions.append(Drain(node_name, reason))
    for name in sorted(state.reservations):
        wanted = name in want.reservations or name in want.kept
        if state.reservations[name].owned and not wanted:
            actions.append(DeleteReservation(name))
    for node_name in sorted(state.nodes):
        if state.nodes[node_name].drained_by_gpufleet and node_name not in want.drains:
            actions.append(Resume(node_name))
    return Plan(tuple(actions + qos_last), want, frozenset(left_alone))


def _plan_qos(want: Desired, state: SlurmState) -> tuple[list[Action], list[Action]]:
    """Booking QOS to make or change (first: a job a reservation admits finds its QOS)
    and to delete (last: after the reservation, whose end ends its jobs). None when
    Slurm's QOS were not read; a `gpufleet-` QOS not described as gpufleet's is left
    alone, even one a booking's name would take."""
    if state.qos is None:
        return [], []
    first: list[Action] = []
    for name, qos in want.qos.items():
        have = state.qos.get(name)
        if have is None:
            first.append(CreateQos(qos))
        elif have.owned and (have.grp_tres, have.users, have.accounts) != (
            qos.grp_tres, qos.users, qos.accounts,
        ):  # fmt: skip
            first.append(UpdateQos(qos, have))
    last: list[Action] = [
        DeleteQos(name)
        for name, have in sorted(state.qos.items())
        if have.owned and name not in want.qos and name not in want.qos_kept
    ]
    return first, last
