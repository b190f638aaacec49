"""The console's alert feed ranks alerts (issue 32): however many use alerts arrive,
the node, device and reservation alerts stay in it."""

from __future__ import annotations

from coordinator.api.http.alert_feed import AlertFeed
from shared.wire import Alert


def _alert(kind: str, i: int = 0) -> Alert:
    return Alert(alert_id=f"a{kind}{i}", kind=kind, pool_id="p", node_id="n", at=i)  # type: ignore[arg-type]


def test_a_flood_of_use_alerts_pushes_no_unhealthy_or_at_risk_alert_out() -> None:
    feed = AlertFeed()
    feed.add(_alert("device.unhealthy"))
    feed.add(_alert("reservation.atRisk"))
    for i in range(2000):
        feed.add(_alert("gpu.foreignUse", i))
    feed.add(_alert("node.unreachable"))
    items = feed.after(0)
    kinds = [i.alert.kind for i in items]
    assert kinds[:2] == ["device.unhealthy", "reservation.atRisk"]
    assert kinds[-1] == "node.unreachable" and len(items) == 100
    assert [i.seq for i in items] == sorted(i.seq for i in items)
    # The newest use alerts fill the room left; polling on from the last one is empty.
    assert items[-2].alert.kind == "gpu.foreignUse" and items[-2].seq == feed.last_seq - 1
    assert feed.after(feed.last_seq) == []


def test_use_alerts_keep_a_share_when_other_kinds_abound() -> None:
    feed = AlertFeed()
    for i in range(300):
        feed.add(_alert("node.unreachable", i))
        feed.add(_alert("gpu.unbookedUse", i))
    kinds = [i.alert.kind for i in feed.after(0, limit=100)]
    assert kinds.count("gpu.unbookedUse") == 25 and kinds.count("node.unreachable") == 75
    # Few enough to fit: everything, in order.
    small = AlertFeed()
    small.add(_alert("gpu.unbookedUse"))
    small.add(_alert("device.unhealthy"))
    assert [i.seq for i in small.after(0)] == [1, 2]


def _use(kind: str, rid: str, i: int) -> Alert:
    return Alert(
        alert_id=f"u{kind}{rid}{i}", kind=kind, pool_id="p", node_id="n", at=i,  # type: ignore[arg-type]
        reservation_id=rid, details={"tenantId": "acme", "idleSince": i - 5},
    )  # fmt: skip


def test_the_idle_reservations_stay_known_after_the_ring_dropped_their_alert() -> None:
    """The console counts idle bookings from the open `reservation.idle` conditions
    (issue 34): opened by `reservation.idle`, closed by `reservation.inUse`, kept
    whatever number of later use alerts pushed the alert itself out of the feed."""
    feed = AlertFeed()
    feed.add(_use("reservation.idle", "r1", 10))
    feed.add(_use("reservation.idle", "r2", 11))
    feed.add(_use("reservation.idle", "r3", 12))
    feed.add(_use("reservation.inUse", "r2", 13))
    for i in range(500):
        feed.add(_alert("gpu.foreignUse", i))
    assert not [i for i in feed.after(0) if i.alert.kind == "reservation.idle"]
    assert [(a.reservation_id, a.details["idleSince"]) for a in feed.idle.open()] == [
        ("r1", 5),
        ("r3", 7),
    ]
    feed.add(_use("reservation.inUse", "r1", 600))  # e.g. it ended while idle
    assert [a.reservation_id for a in feed.idle.open()] == ["r3"]
