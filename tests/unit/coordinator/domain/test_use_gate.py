"""How often one GPU may alert (issue 32): a burst at once, then one per period; the
transitions held meanwhile are said as one alert that counts them."""

from __future__ import annotations

from coordinator.domain.gpu_use_gate import gate
from coordinator.domain.gpu_use_join import Policy, UseTransition

POLICY = Policy(unit_alert_burst=2, unit_alert_every_ms=60_000)


def _foreign(owner: str, unit: str = "GPU-0") -> UseTransition:
    return UseTransition(
        "gpu.foreignUse", "p1", "n1", f"a process of {owner}", device_id=unit,
        details={"owner": owner},
    )  # fmt: skip


def test_a_unit_says_a_burst_then_one_alert_per_period_that_counts_the_rest() -> None:
    gates, said = gate({}, [_foreign(f"o{i}") for i in range(5)], 0, POLICY)
    assert [t.details["owner"] for t in said] == ["o0", "o1"]
    # Another unit and a reservation's alert are not held by this one.
    idle = UseTransition("reservation.idle", "p1", "n1", "idle", reservation_id="rsv_x")
    gates, said = gate(gates, [_foreign("x", unit="GPU-1"), idle], 1000, POLICY)
    assert [t.kind for t in said] == ["gpu.foreignUse", "reservation.idle"]
    gates, said = gate(gates, [_foreign("o5")], 30_000, POLICY)
    assert said == []
    # The period is over: the held ones as one, the latest, counting all four.
    gates, said = gate(gates, [], 60_000, POLICY)
    (one,) = said
    assert one.details["owner"] == "o5"
    assert (one.details["repeats"], one.details["heldSince"]) == (4, 0)
    assert "4 use alerts" in one.reason
    gates, said = gate(gates, [], 120_000, POLICY)
    assert said == []
    # Quiet long enough: the bucket is full again and forgotten.
    gates, said = gate(gates, [], 400_000, POLICY)
    assert gates == {}


def test_two_thousand_transitions_make_a_bounded_handful_of_alerts() -> None:
    policy = Policy()  # the defaults: 4 at once, then one every 5 min
    gates: dict = {}  # type: ignore[type-arg]
    total = 0
    # 2,000 transitions on one unit over about 70 s (a pass every 5 s).
    for k in range(14):
        gates, said = gate(gates, [_foreign(f"o{k}-{i}") for i in range(143)], k * 5000, policy)
        total += len(said)
    assert total == policy.unit_alert_burst
    gates, said = gate(gates, [], 14 * 5000 + policy.unit_alert_every_ms, policy)
    assert [t.details["repeats"] for t in said] == [14 * 143 - policy.unit_alert_burst]
