"""A booking's QOS (Slurm accounting): the planner gives every booking it reserves a QOS
`gpufleet-<id>` capping its GPUs by type and in total, allowed to its users and
accounts, made before its reservation and deleted after it; none where Slurm's QOS were
not read; a QOS it did not make (no gpufleet description) is never changed or deleted.
sacctmgr's listings parse as Slurm 22.05 prints them, and each action is the sacctmgr
calls that make it so (tests/e2e/test_slurm_booking_qos.py runs them on a real one)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ops.slurm.bridge.model import (
    Action,
    CreateQos,
    DeleteQos,
    DeleteReservation,
    Ledger,
    LedgerReservation,
    SlurmNode,
    SlurmQos,
    SlurmReservation,
    SlurmState,
    UpdateQos,
)
from ops.slurm.bridge.planner import Policy, plan
from ops.slurm.bridge.sacctmgr import ListingError, parse_qos, qos_argvs, split_listings

NOW_MS = 1_800_000_000_000
NOW_S = NOW_MS // 1000
HOUR = 3_600_000
POLICY = Policy(accounts={"acme": ("acme-acct",)}, users={"globex": ("alice", "bob")},
                gpu_tres="cores")  # fmt: skip
NODES = {
    "gpu-a": SlurmNode("gpu-a", gpu_types=("h100",), cores_per_gpu=2),
    "gpu-m": SlurmNode("gpu-m", gpu_types=("a100", "a100_3g.40gb", "a100_1g.10gb")),
}


def _rsv(rid: str, tenant: str = "acme", **kw: object) -> LedgerReservation:
    values: dict[str, object] = {
        "tenant_id": tenant, "pool_id": "p", "state": "active", "start_ms": NOW_MS - HOUR,
        "end_ms": NOW_MS + HOUR, "nodes": frozenset({"gpu-a"}), "gpus": {"gpu-a": 2},
    } | kw  # fmt: skip
    return LedgerReservation(reservation_id=rid, **values)  # type: ignore[arg-type]


def _state(qos: dict[str, SlurmQos] | None, *rsvs: SlurmReservation) -> SlurmState:
    return SlurmState({r.name: r for r in rsvs}, NODES, qos)


def _converge(ledger: Ledger, state: SlurmState) -> SlurmState:
    """The plan applied as slurmctld and slurmdbd would, to what the planner reads."""
    rsvs = dict(state.reservations)
    qos = dict(state.qos or {})
    for a in plan(ledger, state, POLICY).actions:
        if isinstance(a, CreateQos | UpdateQos):
            qos[a.want.name] = a.want
        elif isinstance(a, DeleteQos):
            del qos[a.name]
        elif isinstance(a, DeleteReservation):
            del rsvs[a.name]
        elif a.kind == "reservation.create":
            rsvs[a.want.name] = a.want  # type: ignore[union-attr]
    return SlurmState(rsvs, NODES, qos)


def test_each_booking_gets_a_qos_of_its_gpus_made_before_its_reservation() -> None:
    mig = _rsv("rsv_2", "globex", nodes=frozenset({"gpu-m"}), gpus={"gpu-m": 1},
               mig={"gpu-m": {"3g.40gb": 2}})  # fmt: skip
    ledger = Ledger((_rsv("rsv_1"), mig), (), NOW_MS)
    actions = plan(ledger, _state({}), POLICY).actions
    assert [a.kind for a in actions] == ["qos.create"] * 2 + ["reservation.create"] * 2
    made = {a.want.name: a.want for a in actions if isinstance(a, CreateQos)}
    assert made["gpufleet-rsv_1"] == SlurmQos(
        "gpufleet-rsv_1", "gres/gpu:h100=2,gres/gpu=2", accounts=frozenset({"acme-acct"})
    )
    # MIG instances by the type `slurm conf` gives them; the total counts them too.
    assert made["gpufleet-rsv_2"].grp_tres == "gres/gpu:a100=1,gres/gpu:a100_3g.40gb=2,gres/gpu=3"
    assert made["gpufleet-rsv_2"].users == {"alice", "bob"}
    assert qos_argvs(CreateQos(made["gpufleet-rsv_2"])) == [
        ["-i", "add", "qos", "gpufleet-rsv_2", "set", "Description=gpufleet booking",
         "GrpTRES=gres/gpu:a100=1,gres/gpu:a100_3g.40gb=2,gres/gpu=3"],
        ["-i", "modify", "user", "where", "name=alice,bob", "set", "qos+=gpufleet-rsv_2"],
    ]  # fmt: skip
    # Applied, nothing is left to do.
    assert plan(ledger, _converge(ledger, _state({})), POLICY).actions == ()


def test_no_qos_is_planned_where_accounting_was_not_read() -> None:
    ledger = Ledger((_rsv("rsv_1"),), (), NOW_MS)
    assert [a.kind for a in plan(ledger, _state(None), POLICY).actions] == ["reservation.create"]


def test_a_released_booking_s_qos_goes_after_its_reservation_and_others_stay() -> None:
    ledger = Ledger((_rsv("rsv_1"),), (), NOW_MS)
    held = _converge(ledger, _state({
        "normal": SlurmQos("normal", description="Normal QOS default"),
        "gpufleet-theirs": SlurmQos("gpufleet-theirs", description="made by hand"),
    }))  # fmt: skip
    released = Ledger((replace(ledger.reservations[0], state="released"),), (), NOW_MS)
    actions: tuple[Action, ...] = plan(released, held, POLICY).actions
    assert actions == (DeleteReservation("gpufleet-rsv_1"), DeleteQos("gpufleet-rsv_1"))
    assert qos_argvs(DeleteQos("gpufleet-rsv_1")) == [
        ["-i", "delete", "qos", "where", "name=gpufleet-rsv_1"]
    ]
    # A booking whose name a hand-made QOS already takes: that QOS is left alone.
    clash = Ledger((ledger.reservations[0], _rsv("theirs")), (), NOW_MS)
    assert [a.kind for a in plan(clash, held, POLICY).actions] == ["reservation.create"]


def test_a_changed_booking_changes_its_qos_limits_and_who_may_use_it() -> None:
    have = SlurmQos("gpufleet-rsv_1", "gres/gpu:h100=2,gres/gpu=2",
                    users=frozenset({"carol"}), accounts=frozenset({"acme-acct"}))  # fmt: skip
    grown = Ledger((_rsv("rsv_1", gpus={"gpu-a": 3}),), (), NOW_MS)
    (update,) = [a for a in plan(grown, _state({have.name: have}), POLICY).actions
                 if a.kind.startswith("qos")]  # fmt: skip
    assert isinstance(update, UpdateQos) and update.want.grp_tres == "gres/gpu:h100=3,gres/gpu=3"
    assert qos_argvs(update) == [
        ["-i", "modify", "qos", "where", "name=gpufleet-rsv_1", "set",
         "GrpTRES=gres/gpu:h100=3,gres/gpu=3"],
        ["-i", "modify", "user", "where", "name=carol", "set", "qos-=gpufleet-rsv_1"],
    ]  # fmt: skip
    # A limit no longer wanted is cleared (-1); no GPU at all: no cap.
    none = replace(update, want=replace(update.want, grp_tres="", users=frozenset({"carol"})))
    assert qos_argvs(none) == [
        ["-i", "modify", "qos", "where", "name=gpufleet-rsv_1", "set",
         "GrpTRES=gres/gpu:h100=-1,gres/gpu=-1"],
    ]  # fmt: skip


def test_a_kept_reservation_keeps_its_qos() -> None:
    """A node missing from Slurm's listing keeps the booking's reservation, and its QOS."""
    rsv = _rsv("rsv_1", nodes=frozenset({"gpu-a", "gone"}), gpus={"gpu-a": 1, "gone": 1})
    held = SlurmReservation("gpufleet-rsv_1", frozenset({"gpu-a", "gone"}), 0, NOW_S + 60)
    qos = SlurmQos("gpufleet-rsv_1", "gres/gpu=2")
    assert plan(Ledger((rsv,), (), NOW_MS), _state({qos.name: qos}, held), POLICY).actions == ()


def test_sacctmgr_listings_parse_as_slurm_prints_them() -> None:
    qos = (
        "normal||Normal QOS default\n"
        "gpufleet-rsv_01abc|gres/gpu:h100=2,gres/gpu=2|gpufleet booking\n"
    )
    assoc = (
        "|root|normal\nroot|root|gpufleet-rsv_01abc,normal\n|acme|gpufleet-rsv_01abc\n"
        "root|acme|gpufleet-rsv_01abc,normal\nbob|acme|normal\nbob|other|gpufleet-rsv_01abc\n"
    )
    got = parse_qos(qos, assoc)
    assert not got["normal"].owned and got["gpufleet-rsv_01abc"].owned
    mine = got["gpufleet-rsv_01abc"]
    assert mine.grp_tres == "gres/gpu:h100=2,gres/gpu=2"
    # bob may use it under one account of two: not yet allowed everywhere.
    assert mine.users == {"root"} and mine.accounts == {"acme"}


# Slurm 22.05's answer (Debian, with readline) to the bridge's one read: each command
# echoed after the prompt, `version` between the listings.
READ_ANSWER = (
    "sacctmgr: show qos format=name,grptres,description\nnormal||Normal QOS default\n"
    "gpufleet-x|cpu=1|gpufleet booking\nsacctmgr: version\nslurm-wlm 22.05.8\n"
    "sacctmgr: show assoc format=user,account,qos\n|root|normal\nroot|root|normal\n"
    "sacctmgr: \n"
)


def test_one_sacctmgr_answer_splits_into_both_listings() -> None:
    qos, assoc = split_listings(READ_ANSWER)
    assert qos == "normal||Normal QOS default\ngpufleet-x|cpu=1|gpufleet booking\n"
    assert assoc == "|root|normal\nroot|root|normal\n"
    # Without readline: the prompt before each answer, no echo; a newer version line.
    bare = "sacctmgr: normal||Normal QOS default\nsacctmgr: slurm 23.11.1\nsacctmgr: |root|normal\n"
    assert split_listings(bare) == ("normal||Normal QOS default\n", "|root|normal\n")
    with pytest.raises(ListingError, match="no version line"):
        split_listings("normal||Normal QOS default\n")
