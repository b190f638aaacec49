"""How often one GPU may alert (issue 32): a burst at once, then one round per period;
the starts held meanwhile are said then, each counting them. Use is a condition (issue
34): a start said is always ended, a start held and ended is never said."""

from __future__ import annotations

from coordinator.domain.gpu_use_gate import gate
from coordinator.domain.gpu_use_join import UseTransition
from coordinator.domain.gpu_use_units import Policy

POLICY = Policy(unit_alert_burst=2, unit_alert_every_ms=60_000)


def _foreign(owner: str, unit: str = "GPU-0", ended: bool = False) -> UseTransition:
    return UseTransition(
        "gpu.foreignUseEnded" if ended else "gpu.foreignUse", "p1", "n1",
        f"a process of {owner}", device_id=unit, details={"owner": owner, "ownerKind": "pod"},
    )  # fmt: skip


def test_a_unit_says_a_burst_then_one_round_per_period_that_counts_the_rest() -> None:
    gates, said = gate({}, [_foreign(f"o{i}") for i in range(5)], 0, POLICY)
    assert [t.details["owner"] for t in said] == ["o0", "o1"]
    # Another unit and a reservation's alert are not held by this one.
    idle = UseTransition("reservation.idle", "p1", "n1", "idle", reservation_id="rsv_x")
    gates, said = gate(gates, [_foreign("x", unit="GPU-1"), idle], 1000, POLICY)
    assert [t.kind for t in said] == ["gpu.foreignUse", "reservation.idle"]
    # o2 stopped while held: never said, never ended.
    gates, said = gate(gates, [_foreign("o5"), _foreign("o2", ended=True)], 30_000, POLICY)
    assert said == []
    # The period is over: every start still held, each counting the four held.
    gates, said = gate(gates, [], 60_000, POLICY)
    assert [t.details["owner"] for t in said] == ["o3", "o4", "o5"]
    assert {(t.details["repeats"], t.details["heldSince"]) for t in said} == {(4, 0)}
    assert "4 use alerts" in said[0].reason
    gates, said = gate(gates, [], 120_000, POLICY)
    assert said == []
    # Quiet long enough: the bucket is full again and forgotten.
    gates, said = gate(gates, [], 400_000, POLICY)
    assert gates == {}


def test_an_end_of_a_start_said_is_never_held() -> None:
    gates, said = gate({}, [_foreign("o0"), _foreign("o1"), _foreign("o2")], 0, POLICY)
    assert len(said) == 2
    # The bucket is empty, yet the ends of what was said go out at once; o2's start and
    # end cancel.
    ends = [_foreign(o, ended=True) for o in ("o0", "o1", "o2")]
    gates, said = gate(gates, ends, 1000, POLICY)
    assert [(t.kind, t.details["owner"]) for t in said] == [
        ("gpu.foreignUseEnded", "o0"), ("gpu.foreignUseEnded", "o1"),
    ]  # fmt: skip
    gates, said = gate(gates, [], 120_000, POLICY)
    assert said == []


def test_two_thousand_transitions_make_a_bounded_handful_of_alerts() -> None:
    policy = Policy()  # the defaults: 4 at once, then one round every 5 min
    gates: dict = {}  # type: ignore[type-arg]
    total = 0
    # 2,000 starts on one unit over about 70 s (a pass every 5 s), 8 owners at a time
    # (a unit's bound), each pass ending the last pass's owners as the join would.
    last: list[str] = []
    for k in range(250):
        owners = [f"o{k}-{i}" for i in range(8)]
        ts = [_foreign(o, ended=True) for o in last] + [_foreign(o) for o in owners]
        gates, said = gate(gates, ts, k * 280, policy)
        total += sum(t.kind == "gpu.foreignUse" for t in said)
        last = owners
    assert total == policy.unit_alert_burst
    gates, said = gate(gates, [], 250 * 280 + policy.unit_alert_every_ms, policy)
    # The owners running now, each counting every start held.
    assert [t.details["repeats"] for t in said] == [2000 - policy.unit_alert_burst] * 8
