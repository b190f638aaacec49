"""The Slurm bridge's planner: what the ledger asks of Slurm, and that a plan applied to
any Slurm state converges (planning again gives nothing) and never touches a
reservation or drain gpufleet does not own.

`SimSlurm` applies actions as slurmctld does to the part of its state the planner
reads (tests/e2e/test_slurm_bridge.py does the same against a real one)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from ops.slurm.bridge.model import (
    Action,
    CreateReservation,
    DeleteReservation,
    Drain,
    Ledger,
    LedgerNode,
    LedgerReservation,
    Resume,
    SlurmNode,
    SlurmReservation,
    SlurmState,
    UpdateReservation,
)
from ops.slurm.bridge.planner import Policy, desired, drain_reason, plan
from ops.slurm.bridge.scontrol import action_argv

NOW_MS = 1_800_000_000_000
NOW_S = NOW_MS // 1000
HOUR = 3_600_000
POLICY = Policy(accounts={"acme": ("acme-acct",)}, users={"globex": ("alice", "bob")})


def apply(state: SlurmState, actions: tuple[Action, ...], now_s: int = NOW_S) -> SlurmState:
    """The actions as slurmctld applies them to what the planner reads."""
    rsvs, nodes = dict(state.reservations), dict(state.nodes)
    for a in actions:
        if isinstance(a, CreateReservation):
            assert a.want.name not in rsvs, "created twice"
            rsvs[a.want.name] = replace(a.want, start_s=max(a.want.start_s, now_s))
        elif isinstance(a, UpdateReservation):
            have, w = rsvs[a.want.name], a.want
            fields = {
                "nodes": w.nodes, "end_s": w.end_s, "tres": w.tres, "users": w.users,
                "accounts": w.accounts, "start_s": max(w.start_s, now_s),
            }  # fmt: skip
            wanted = {f: v for f, v in fields.items() if f.removesuffix("_s") in a.changed}
            rsvs[w.name] = replace(have, **wanted)
        elif isinstance(a, DeleteReservation):
            del rsvs[a.name]
        elif isinstance(a, Drain):
            nodes[a.node] = replace(nodes[a.node], drained=True, reason=a.reason)
        elif isinstance(a, Resume):
            nodes[a.node] = replace(nodes[a.node], drained=False, reason="")
    return SlurmState(rsvs, nodes)


def _node(name: str, drained: bool = False, reason: str = "") -> SlurmNode:
    return SlurmNode(name, drained, reason, ("h100",))


def _slurm(*nodes: SlurmNode, rsvs: tuple[SlurmReservation, ...] = ()) -> SlurmState:
    return SlurmState({r.name: r for r in rsvs}, {n.name: n for n in nodes})


def _rsv(rid: str, nodes: dict[str, int], **kw: object) -> LedgerReservation:
    values: dict[str, object] = {
        "tenant_id": "acme", "pool_id": "pool_a", "state": "active",
        "start_ms": NOW_MS - HOUR, "end_ms": NOW_MS + HOUR,
    } | kw  # fmt: skip
    return LedgerReservation(
        reservation_id=rid,
        nodes=frozenset(nodes),
        gpus=nodes,
        **values,  # type: ignore[arg-type]
    )


def test_a_live_booking_becomes_a_named_reservation_with_typed_gpus_and_account() -> None:
    ledger = Ledger((_rsv("rsv_1", {"gpu-a": 4}),), (), NOW_MS)
    p = plan(ledger, _slurm(_node("gpu-a")), POLICY)
    assert p.actions == (
        CreateReservation(
            SlurmReservation(
                name="gpufleet-rsv_1", nodes=frozenset({"gpu-a"}), start_s=NOW_S - 3600,
                end_s=NOW_S + 3600, tres="gres/gpu:h100=4", accounts=frozenset({"acme-acct"}),
            )
        ),
    )  # fmt: skip


def test_tres_modes_and_whole_node_bookings() -> None:
    ledger = Ledger(
        (_rsv("rsv_1", {"gpu-a": 2, "gpu-b": 3}), _rsv("rsv_2", {"gpu-a": 8}, binding="node")),
        (),
        NOW_MS,
    )
    state = _slurm(_node("gpu-a"), SlurmNode("gpu-b", gpu_types=()))
    mig = SlurmNode("gpu-a", gpu_types=("a100_1g.10gb", "a100"))  # as `slurm conf` names them
    mixed = plan(Ledger((_rsv("rsv_3", {"gpu-a": 2}),), (), NOW_MS), _slurm(mig), POLICY)
    assert mixed.desired.reservations["gpufleet-rsv_3"].tres == "gres/gpu:a100=2"
    want = plan(ledger, state, POLICY).desired.reservations
    # Uneven over two nodes: a reservation per node (its type, or untyped where none).
    assert want["gpufleet-rsv_1--gpu-a"].tres == "gres/gpu:h100=2"
    assert want["gpufleet-rsv_1--gpu-b"].tres == "gres/gpu=3"
    assert want["gpufleet-rsv_2"].tres == ""  # binding node: the whole node
    counted = plan(ledger, state, replace(POLICY, gpu_tres="count")).desired.reservations
    assert counted["gpufleet-rsv_1--gpu-b"].tres == "gres/gpu=3"
    off = plan(ledger, state, replace(POLICY, gpu_tres="off")).desired.reservations
    assert off["gpufleet-rsv_1"].tres == ""


def test_renew_release_expiry_and_preemption_update_or_delete() -> None:
    state = apply(_slurm(_node("gpu-a")), plan(
        Ledger((_rsv("rsv_1", {"gpu-a": 4}),), (), NOW_MS), _slurm(_node("gpu-a")), POLICY
    ).actions)  # fmt: skip
    renewed = Ledger((_rsv("rsv_1", {"gpu-a": 4}, end_ms=NOW_MS + 3 * HOUR),), (), NOW_MS)
    (update,) = plan(renewed, state, POLICY).actions
    assert isinstance(update, UpdateReservation) and update.changed == ("end",)
    assert update.want.end_s == NOW_S + 3 * 3600
    noticed = Ledger(
        (_rsv("rsv_1", {"gpu-a": 4}, state="noticed", preempt_at_ms=NOW_MS + 120_000),), (), NOW_MS
    )
    (cut,) = plan(noticed, state, POLICY).actions
    assert isinstance(cut, UpdateReservation) and cut.want.end_s == NOW_S + 120
    leased = Ledger(
        (_rsv("rsv_1", {"gpu-a": 4}, lease_expires_at_ms=NOW_MS + 600_000),), (), NOW_MS
    )
    (lease,) = plan(leased, state, POLICY).actions
    assert isinstance(lease, UpdateReservation) and lease.want.end_s == NOW_S + 600
    for gone in ("released", "expired", "preempted", "completed"):
        ended = Ledger((_rsv("rsv_1", {"gpu-a": 4}, state=gone),), (), NOW_MS)
        assert plan(ended, state, POLICY).actions == (DeleteReservation("gpufleet-rsv_1"),)
    past = Ledger((_rsv("rsv_1", {"gpu-a": 4}, end_ms=NOW_MS - 1),), (), NOW_MS)
    assert plan(past, state, POLICY).actions == (DeleteReservation("gpufleet-rsv_1"),)


def test_drains_follow_maintenance_unhealthy_unreachable_and_their_end() -> None:
    nodes = (
        LedgerNode("gpu-a", "pool_a", maintenance=True, maintenance_reason="swap PSU"),
        LedgerNode("gpu-b", "pool_a", health="unhealthy", health_reasons=("xid 79",)),
        LedgerNode("gpu-c", "pool_a", reachable=False, maintenance=True),
        LedgerNode("gpu-d", "pool_a", health="degraded"),
    )
    state = _slurm(*(_node(n) for n in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")))
    p = plan(Ledger((), nodes, NOW_MS), state, POLICY)
    assert p.actions == (
        Drain("gpu-a", "gpufleet: maintenance: swap PSU"),
        Drain("gpu-b", "gpufleet: unhealthy: xid 79"),
        Drain("gpu-c", "gpufleet: unreachable"),
    )
    drained = apply(state, p.actions)
    healthy = tuple(LedgerNode(n.node_id, "pool_a") for n in nodes)
    assert plan(Ledger((), healthy, NOW_MS), drained, POLICY).actions == (
        Resume("gpu-a"), Resume("gpu-b"), Resume("gpu-c"),
    )  # fmt: skip
    only = replace(POLICY, drain_on=("maintenance",))
    assert drain_reason(nodes[1], only.drain_on) is None


def test_a_node_with_any_unhealthy_gpu_is_drained_and_resumed_when_cleared() -> None:
    """Slurm 22.05 cannot take one GPU out of a node: a degraded node with an unhealthy
    GPU (XID 79) is drained, the GPU named; a degraded one whose GPUs are all healthy
    (a slowdown) is not. What the agent wrote reaches Slurm without control characters."""
    xid = LedgerNode("gpu-a", "pool_a", health="degraded",
                     health_reasons=("GPU-1234: unhealthy: xid 79",),
                     unhealthy_gpus=("GPU3 xid 79\x1b[31m fell off\x85the bus\n",))  # fmt: skip
    slow = LedgerNode("gpu-b", "pool_a", health="degraded", health_reasons=("thermal",))
    state = _slurm(_node("gpu-a"), _node("gpu-b"))
    p = plan(Ledger((), (xid, slow), NOW_MS), state, POLICY)
    assert p.actions == (Drain("gpu-a", "gpufleet: unhealthy: GPU3 xid 79 [31m fell off the bus"),)
    cleared = (replace(xid, health="healthy", unhealthy_gpus=()), slow)
    assert plan(Ledger((), cleared, NOW_MS), apply(state, p.actions), POLICY).actions == (
        Resume("gpu-a"),
    )
    assert plan(Ledger((), (xid,), NOW_MS), state, replace(POLICY, drain_on=())).actions == ()


def test_unreachable_drains_only_after_its_grace_period() -> None:
    """An agent restart or rolling upgrade (unreachable for a few heartbeats) drains
    nothing; a node still unreachable after `unreachable_grace_s` is drained."""
    policy = replace(POLICY, unreachable_grace_s=120)
    state = _slurm(_node("gpu-a"))

    def ledger(since_ms: int) -> Ledger:
        node = LedgerNode("gpu-a", "pool_a", reachable=False, reachable_since_ms=since_ms)
        return Ledger((), (node,), NOW_MS)

    early = plan(ledger(NOW_MS - 30_000), state, policy)
    assert early.actions == ()
    assert early.desired.recheck_at_ms == NOW_MS + 90_000  # the bridge passes again then
    assert plan(ledger(NOW_MS - 119_999), state, policy).actions == ()
    assert plan(ledger(NOW_MS - 120_000), state, policy).actions == (
        Drain("gpu-a", "gpufleet: unreachable"),
    )


def test_a_node_missing_from_slurm_keeps_its_reservation() -> None:
    """A node that leaves Slurm's listing (renamed, a node_names typo) keeps the
    reservation it had, unchanged and named in `kept`; released, it goes."""
    rsv = _rsv("rsv_1", {"gpu-a": 2, "gpu-b": 1})
    held = SlurmReservation(
        "gpufleet-rsv_1", frozenset({"gpu-a", "gpu-b"}), NOW_S - 3600, NOW_S + 3600,
        accounts=frozenset({"acme-acct"}),
    )  # fmt: skip
    state = _slurm(_node("gpu-a"), rsvs=(held,))  # gpu-b is gone from Slurm's listing
    p = plan(Ledger((rsv,), (), NOW_MS), state, POLICY)
    assert p.actions == ()
    assert p.desired.kept == {"gpufleet-rsv_1"} and p.desired.unknown_nodes == {"gpu-b"}
    released = replace(rsv, state="released")
    assert plan(Ledger((released,), (), NOW_MS), state, POLICY).actions == (
        DeleteReservation("gpufleet-rsv_1"),
    )


def test_cores_mode_reserves_the_booked_gpus_cores_per_node() -> None:
    """Slurm before 23.11 (`cores`): on nodes with a socket per GPU a booking is its
    GPUs' cores (`CoreCnt` per node, no OVERLAP: Slurm gives each its own cores); a
    node without that layout, a MIG or whole-node booking is the nodes whole."""
    policy = replace(POLICY, gpu_tres="cores")
    state = _slurm(
        SlurmNode("gpu-a", gpu_types=("h100",), cores_per_gpu=14),
        SlurmNode("gpu-b", gpu_types=("h100",), cores_per_gpu=14),
        SlurmNode("gpu-c", gpu_types=("h100",)),
    )  # fmt: skip
    ledger = Ledger(
        (_rsv("rsv_1", {"gpu-a": 4, "gpu-b": 2}), _rsv("rsv_2", {"gpu-a": 1, "gpu-c": 1}),
         _rsv("rsv_3", {"gpu-a": 2}, binding="node")),
        (), NOW_MS,
    )  # fmt: skip
    want = desired(ledger, state, policy).reservations
    assert want["gpufleet-rsv_1"].cores == (("gpu-a", 56), ("gpu-b", 28))
    assert want["gpufleet-rsv_1"].core_total == 84 and want["gpufleet-rsv_1"].tres == ""
    assert want["gpufleet-rsv_2"].cores == () and want["gpufleet-rsv_3"].cores == ()
    argv = action_argv(CreateReservation(want["gpufleet-rsv_1"]), NOW_S)
    assert "Nodes=gpu-a,gpu-b" in argv and "CoreCnt=56,28" in argv
    assert argv[-1] == "Flags=IGNORE_JOBS"
    assert action_argv(CreateReservation(want["gpufleet-rsv_2"]), NOW_S)[-1] == (
        "Flags=OVERLAP,IGNORE_JOBS"
    )
    # A booking that grows is made again: Slurm cannot be told which cores to add.
    grown = Ledger((_rsv("rsv_1", {"gpu-a": 5, "gpu-b": 2}),), (), NOW_MS)
    held = replace(want["gpufleet-rsv_1"], start_s=NOW_S - 3600)
    p = plan(grown, _slurm(*state.nodes.values(), rsvs=(held,)), policy)
    assert [a.kind for a in p.actions] == ["reservation.delete", "reservation.create"]


def test_hand_made_reservations_and_drains_survive() -> None:
    theirs = SlurmReservation("maint-window", frozenset({"gpu-a"}), NOW_S, NOW_S + 60)
    state = _slurm(_node("gpu-a", True, "bad fan"), _node("gpu-b"), rsvs=(theirs,))
    sick = LedgerNode("gpu-a", "pool_a", health="unhealthy")
    p = plan(Ledger((), (sick, LedgerNode("gpu-b", "pool_a")), NOW_MS), state, POLICY)
    assert p.actions == () and p.left_alone == {"gpu-a"}
    # Healthy again: their drain stays.
    assert plan(Ledger((), (LedgerNode("gpu-a", "pool_a"),), NOW_MS), state, POLICY).actions == ()


def test_mig_instances_go_by_the_type_slurm_conf_gives_their_profile() -> None:
    node = SlurmNode("gpu-a", gpu_types=("a100", "a100_3g.40gb", "a100_1g.10gb"))
    rsv = _rsv("rsv_1", {"gpu-a": 1}, mig={"gpu-a": {"3g.40gb": 2, "7g.80gb": 1}})
    ledger = Ledger((rsv,), (), NOW_MS)
    typed = plan(ledger, _slurm(node), POLICY).desired.reservations["gpufleet-rsv_1"]
    # 7g.80gb: no such type on the node, so not expressible: left out.
    assert typed.tres == "gres/gpu:a100=1,gres/gpu:a100_3g.40gb=2"
    counted = plan(ledger, _slurm(node), replace(POLICY, gpu_tres="count"))
    assert counted.desired.reservations["gpufleet-rsv_1"].tres == "gres/gpu=3"


def test_a_booking_of_only_nics_or_disks_is_no_slurm_reservation() -> None:
    ledger = Ledger(
        (_rsv("rsv_1", {"gpu-a": 0}, classes=frozenset({"nic.vf", "disk"})),
         _rsv("rsv_2", {"gpu-a": 0}, classes=frozenset({"gpu.mig"})),
         _rsv("rsv_3", {"gpu-a": 0}, classes=frozenset({"disk"}), binding="node")),
        (),
        NOW_MS,
    )  # fmt: skip
    want = plan(ledger, _slurm(_node("gpu-a")), POLICY).desired.reservations
    assert set(want) == {"gpufleet-rsv_2", "gpufleet-rsv_3"}
    assert want["gpufleet-rsv_2"].tres == ""  # MIG of no profile Slurm knows: the node whole


def test_unknown_nodes_and_unmapped_tenants_are_left_out_and_reported() -> None:
    ledger = Ledger(
        (_rsv("rsv_1", {"gpu-a": 1, "ghost": 1}), _rsv("rsv_2", {"gpu-a": 1}, tenant_id="nobody"),
         _rsv("rsv_3", {"ghost": 2})),
        (LedgerNode("ghost-2", "pool_a", reachable=False),),
        NOW_MS,
    )  # fmt: skip
    p = plan(ledger, _slurm(_node("gpu-a")), POLICY)
    assert p.desired.unknown_nodes == {"ghost", "ghost-2"}
    assert p.desired.unmapped == {"rsv_2"}
    assert [a.want.name for a in p.actions if isinstance(a, CreateReservation)] == [
        "gpufleet-rsv_1"
    ]
    assert p.desired.reservations["gpufleet-rsv_1"].nodes == {"gpu-a"}


def test_pools_and_node_names() -> None:
    policy = replace(POLICY, pools=("pool_a",), node_names={"gpu-a.example": "gpu-a"})
    ledger = Ledger(
        (_rsv("rsv_1", {"gpu-a.example": 2}),
         _rsv("rsv_2", {"gpu-a.example": 2}, pool_id="pool_b")),
        (LedgerNode("gpu-a.example", "pool_a", maintenance=True, maintenance_reason="x"),),
        NOW_MS,
    )  # fmt: skip
    p = plan(ledger, _slurm(_node("gpu-a")), policy)
    assert set(p.desired.reservations) == {"gpufleet-rsv_1"}
    assert p.desired.drains == {"gpu-a": "gpufleet: maintenance: x"}


# --- any Slurm state --------------------------------------------------------------------

NODES = ("n1", "n2", "n3", "n4")
_names = st.sampled_from(NODES)
_times = st.integers(NOW_S - 7200, NOW_S + 7200)
_slurm_rsv = st.builds(
    SlurmReservation,
    name=st.sampled_from(["gpufleet-rsv_1", "gpufleet-rsv_2", "gpufleet-old", "theirs", "maint"]),
    nodes=st.frozensets(_names, min_size=1),
    start_s=_times,
    end_s=_times.map(lambda t: t + 3600),
    tres=st.sampled_from(["", "cpu=2,gres/gpu:h100=4", "gres/gpu=1"]),
    users=st.frozensets(st.sampled_from(["alice", "root"])),
    accounts=st.frozensets(st.sampled_from(["acme-acct", "x"])),
)
_slurm_node = st.builds(
    SlurmNode,
    name=_names,
    drained=st.booleans(),
    reason=st.sampled_from(["", "gpufleet: unreachable", "gpufleet: maintenance: x", "fan"]),
    gpu_types=st.sampled_from([(), ("h100",)]),
    cores_per_gpu=st.sampled_from([0, 2]),
)
_ledger_rsv = st.builds(
    _rsv,
    st.sampled_from(["rsv_1", "rsv_2", "rsv_3"]),
    st.dictionaries(_names, st.integers(0, 8), min_size=1),
    tenant_id=st.sampled_from(["acme", "globex", "nobody"]),
    state=st.sampled_from(["scheduled", "active", "noticed", "released", "expired"]),
    start_ms=st.integers(NOW_MS - 2 * HOUR, NOW_MS + 2 * HOUR),
    end_ms=st.integers(NOW_MS - HOUR, NOW_MS + 4 * HOUR),
    binding=st.sampled_from(["hold", "node"]),
    classes=st.frozensets(st.sampled_from(["gpu", "gpu.mig", "nic.vf", "disk"]), min_size=1),
)
_ledger_node = st.builds(
    LedgerNode,
    node_id=st.sampled_from([*NODES, "ghost"]),
    pool_id=st.just("pool_a"),
    reachable=st.booleans(),
    health=st.sampled_from(["healthy", "degraded", "unhealthy", "unmonitored"]),
    maintenance=st.booleans(),
    maintenance_reason=st.sampled_from(["", "swap PSU"]),
)


def _foreign(state: SlurmState) -> tuple[object, ...]:
    rsvs = sorted((n, r) for n, r in state.reservations.items() if not r.owned)
    drains = sorted(
        (n.name, n.reason) for n in state.nodes.values() if n.drained and not n.drained_by_gpufleet
    )
    return (rsvs, drains)


@settings(max_examples=300, deadline=None)
@given(
    slurm_rsvs=st.lists(_slurm_rsv, max_size=6),
    slurm_nodes=st.lists(_slurm_node, max_size=5),
    ledger_rsvs=st.lists(_ledger_rsv, max_size=4, unique_by=lambda r: r.reservation_id),
    ledger_nodes=st.lists(_ledger_node, max_size=5, unique_by=lambda n: n.node_id),
    tres=st.sampled_from(["typed", "count", "cores", "off"]),
)
def test_any_plan_converges_and_touches_only_gpufleet_objects(
    slurm_rsvs: list[SlurmReservation],
    slurm_nodes: list[SlurmNode],
    ledger_rsvs: list[LedgerReservation],
    ledger_nodes: list[LedgerNode],
    tres: str,
) -> None:
    state = SlurmState({r.name: r for r in slurm_rsvs}, {n.name: n for n in slurm_nodes})
    ledger = Ledger(tuple(ledger_rsvs), tuple(ledger_nodes), NOW_MS)
    policy = replace(POLICY, gpu_tres=tres)  # type: ignore[arg-type]
    first = plan(ledger, state, policy)
    for action in first.actions:
        name = getattr(action, "want", None)
        name = name.name if name is not None else getattr(action, "name", None)
        if name is not None:
            assert name.startswith("gpufleet-")
        if isinstance(action, Resume):
            assert state.nodes[action.node].reason.startswith("gpufleet:")
    after = apply(state, first.actions)
    assert plan(ledger, after, policy).actions == ()
    assert _foreign(after) == _foreign(state)
    # The owned reservations are exactly the ledger's live ones on known nodes, and those
    # kept as they were because a node of theirs left Slurm's listing.
    owned = {n for n, r in after.reservations.items() if r.owned}
    assert owned == set(first.desired.reservations) | first.desired.kept


def test_an_uneven_multi_node_booking_is_a_reservation_per_node() -> None:
    """GRES TRES (Slurm 23.11+): a booking of 4 GPUs on one node and 2 on another would
    be one total Slurm spreads its own way (F8), so each node gets a reservation of its
    own, `gpufleet-<id>--<node>`, with its count; an even one stays one reservation.
    Released, every part goes."""
    state = _slurm(_node("gpu-a"), _node("gpu-b"))
    uneven = Ledger((_rsv("rsv_1", {"gpu-a": 4, "gpu-b": 2}),), (), NOW_MS)
    want = plan(uneven, state, POLICY).desired.reservations
    assert {n: (r.nodes, r.tres) for n, r in want.items()} == {
        "gpufleet-rsv_1--gpu-a": ({"gpu-a"}, "gres/gpu:h100=4"),
        "gpufleet-rsv_1--gpu-b": ({"gpu-b"}, "gres/gpu:h100=2"),
    }
    counted = plan(uneven, state, replace(POLICY, gpu_tres="count")).desired.reservations
    assert counted["gpufleet-rsv_1--gpu-b"].tres == "gres/gpu=2"
    even = Ledger((_rsv("rsv_1", {"gpu-a": 3, "gpu-b": 3}),), (), NOW_MS)
    (one,) = plan(even, state, POLICY).desired.reservations.values()
    assert one.name == "gpufleet-rsv_1" and one.tres == "gres/gpu:h100=6"
    whole = plan(uneven, state, replace(POLICY, gpu_tres="off")).desired.reservations
    assert set(whole) == {"gpufleet-rsv_1"}
    made = apply(state, plan(uneven, state, POLICY).actions)
    assert plan(uneven, made, POLICY).actions == ()
    released = Ledger((_rsv("rsv_1", {"gpu-a": 4, "gpu-b": 2}, state="released"),), (), NOW_MS)
    assert {a.kind for a in plan(released, made, POLICY).actions} == {"reservation.delete"}
    assert len(plan(released, made, POLICY).actions) == 2
