"""The one rule of what a viewer sees (issue 32), case by case: it fails closed where an
alert does not say whose it is."""

from __future__ import annotations

from coordinator.domain.disclosure import alert_seen, event_seen, use_seen
from coordinator.domain.model import NodeEvent
from shared.wire import Alert, DeviceUse, ProcessUse


def _alert(kind: str, **details: object) -> Alert:
    return Alert(
        alert_id="a1", kind=kind, pool_id="p", node_id="n0", at=1,  # type: ignore[arg-type]
        reason="a process of reservation rsv_g on a GPU held by rsv_a",
        reservation_id="rsv_g", details=details,
    )  # fmt: skip


def test_a_reservation_alert_reaches_its_tenant_and_operators_only() -> None:
    mine = _alert("reservation.idle", tenantId="acme", idleSince=1)
    assert alert_seen(mine, "acme") == mine and alert_seen(mine, None) == mine
    assert alert_seen(mine, "globex") is None
    # Whose it is unsaid: an operator's only.
    assert alert_seen(_alert("reservation.inUse", ended=True), "acme") is None


def test_foreign_use_reaches_only_the_tenants_it_concerns_naming_only_their_own() -> None:
    foreign = _alert(
        "gpu.foreignUse", owner="rsv_g", ownerKind="reservation", ownerTenantId="globex",
        holders=["rsv_a"], holderTenantIds=["acme"], holderTenants={"rsv_a": "acme"},
        otherTenant=True, pids=[7],
    )  # fmt: skip
    holder = alert_seen(foreign, "acme")
    assert holder is not None and holder.reservation_id is None
    assert holder.details == {
        "owner": None, "ownerKind": "reservation", "ownerTenantId": None,
        "holders": ["rsv_a"], "otherTenant": True,
    }  # fmt: skip
    assert "rsv_g" not in holder.reason
    owner = alert_seen(foreign, "globex")
    assert owner is not None and owner.reservation_id == "rsv_g"
    assert owner.details["holders"] == [] and "rsv_a" not in owner.reason
    assert alert_seen(foreign, "initech") is None
    # Written before holders were told apart: nobody but an operator.
    old = _alert("gpu.foreignUse", owner="pod-1", ownerKind="pod", holders=["rsv_a"])
    assert alert_seen(old, "acme") is None


def test_unbooked_use_says_how_many_not_whose() -> None:
    unbooked = _alert("gpu.unbookedUse", pids=[1, 2], owners=[{"owner": "pod-x"}])
    seen = alert_seen(unbooked, "acme")
    assert seen is not None and seen.details == {"processes": 2}


def test_use_events_are_said_in_general_words_to_a_tenant() -> None:
    event = NodeEvent(1, "n0", "p", "gpu.foreignUse", "… held by rsv_a", "coordinator", 1, "G0")
    assert event_seen(event, None) == event
    assert "rsv_a" not in event_seen(event, "acme").reason
    health = NodeEvent(2, "n0", "p", "node.unhealthy", "xid 79", "coordinator", 1, None)
    assert event_seen(health, "acme") == health


def test_a_shared_unit_shows_each_holder_its_own_processes() -> None:
    use = DeviceUse(
        device_id="G0", sm_util=70, memory_used_mib=3000,
        processes=(
            ProcessUse(pid=1, owner="rsv_a", owner_kind="reservation", sm_util=30,
                       used_memory_mib=1000),
            ProcessUse(pid=2, owner="rsv_g", owner_kind="reservation", sm_util=40,
                       used_memory_mib=2000),
        ),
    )  # fmt: skip
    both = {"rsv_a": "acme", "rsv_g": "globex"}
    acme = use_seen(use, both, "acme")
    assert ([p.pid for p in acme.users], acme.sm_util, acme.memory_used_mib) == ([1], 30, 1000)
    assert use_seen(use, both, None).processes == 2
    other = use_seen(use, {"rsv_g": "globex"}, "acme")
    assert (other.in_use, other.sm_util, other.memory_used_mib, other.users) == (
        True, None, None, ()
    )  # fmt: skip
    alone = use_seen(use, {"rsv_a": "acme"}, "acme")
    assert alone.sm_util == 70 and len(alone.users) == 2


def test_the_end_of_a_use_condition_is_seen_as_its_start_is() -> None:
    """Use is a condition (issue 34): its end reaches whom its start reached, saying no
    more; a foreign use's end to its holder says it ended, naming no one else."""
    gone = _alert(
        "gpu.foreignUseEnded", owner="rsv_g", ownerKind="reservation", ownerTenantId="globex",
        holders=["rsv_a"], holderTenantIds=["acme"], holderTenants={"rsv_a": "acme"},
        ownerName="x",
    )  # fmt: skip
    holder = alert_seen(gone, "acme")
    assert holder is not None and holder.reason.startswith("ended: ")
    assert "rsv_g" not in holder.reason and "ownerName" not in holder.details
    assert alert_seen(gone, "initech") is None
    unbooked = _alert("gpu.unbookedUseEnded", poolName="p")
    seen = alert_seen(unbooked, "acme")
    assert seen is not None and seen.details == {}
    event = NodeEvent(3, "n0", "p", "gpu.foreignUseEnded", "… rsv_a", "coordinator", 1, "G0")
    assert "rsv_a" not in event_seen(event, "acme").reason
