"""What the alert forwarder makes of gpufleet alerts, without NATS or HTTP: one source
per alert name, conditions that end up the same however often and in whatever order the
stream's history is read, and no secret in a log line."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest
import yaml

from ops.forwarder.conditions import CONDITIONS, ENDS, EVENT_PREFIX, Conditions, alert_name
from ops.forwarder.payloads import fingerprint, webhook_payload
from ops.kit.redact import log, redact
from shared.wire import ALERT_KINDS, Alert

RULES = Path(__file__).parents[4] / "monitoring" / "prometheus" / "gpufleet-rules.yml"


def _rule_names() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_no_alert_name_comes_from_both_the_rules_and_the_forwarder() -> None:
    forwarder = {alert_name(kind) for kind in ALERT_KINDS}
    assert len(forwarder) == len(ALERT_KINDS)
    assert _rule_names(), "no rules read"
    assert not _rule_names() & forwarder
    # Nor will a new kind collide: the forwarder's prefix is its own.
    assert not [name for name in _rule_names() if name.startswith(EVENT_PREFIX)]


def test_every_condition_has_a_kind_that_ends_it_and_both_are_alert_kinds() -> None:
    ended = {kind for kinds in ENDS.values() for kind in kinds}
    assert ended == set(CONDITIONS)
    assert set(CONDITIONS) | set(ENDS) <= set(ALERT_KINDS)


def _alert(kind: str, at: int, node: str = "n1") -> Alert:
    return msgspec.convert(
        {"alertId": f"{kind}-{at}", "kind": kind, "poolId": "p", "nodeId": node, "at": at},
        Alert,
    )


def _firing(c: Conditions) -> list[tuple[str, str, int]]:
    return sorted((a.labels["alertname"], a.labels["node"], a.starts_ms) for a in c.firing())


def test_a_condition_fires_until_ended_and_keeps_its_start() -> None:
    c = Conditions(labels={"cluster": "eu"})
    fired = c.apply(_alert("node.unreachable", 1000))
    assert fired.status == "firing" and fired.alertmanager[0].ends_ms is None
    assert fired.alertmanager[0].labels == {
        "alertname": "GpufleetEventNodeUnreachable", "severity": "critical",
        "pool": "p", "node": "n1", "cluster": "eu",
    }  # fmt: skip
    c.apply(_alert("node.unreachable", 2000))  # again: still the same condition
    assert _firing(c) == [("GpufleetEventNodeUnreachable", "n1", 1000)]
    ended = c.apply(_alert("node.reachable", 3000))
    (resolved,) = ended.alertmanager
    assert ended.status == "resolved"
    assert (resolved.starts_ms, resolved.ends_ms) == (1000, 3000)
    assert _firing(c) == []
    # Sent while firing, endsAt is ahead of now; once ended, it is the end.
    assert fired.alertmanager[0].api_v2(5000, 240_000)["endsAt"] == "1970-01-01T00:04:05.000Z"
    assert resolved.api_v2(5000, 240_000)["endsAt"] == "1970-01-01T00:00:03.000Z"


def test_an_end_for_a_condition_never_seen_tells_alertmanager_nothing() -> None:
    out = Conditions().apply(_alert("node.healthy", 1000))
    assert out.alertmanager == ()
    # A webhook still hears of it: every condition the kind ends.
    assert {a.labels["alertname"] for a in out.notified} == {
        "GpufleetEventNodeUnhealthy", "GpufleetEventNodeUnmonitored", "GpufleetEventNodeDegraded",
    }  # fmt: skip


def test_replaying_history_then_the_same_alerts_again_ends_in_the_same_state() -> None:
    history = [
        _alert("node.unreachable", 1000),
        _alert("node.unreachable", 1500, node="n2"),
        _alert("node.reachable", 2000),
        _alert("device.unhealthy", 2500, node="n2"),
    ]
    c = Conditions()
    for a in history:
        c.apply(a)
    state = _firing(c)
    assert state == [
        ("GpufleetEventDeviceUnhealthy", "n2", 2500),
        ("GpufleetEventNodeUnreachable", "n2", 1500),
    ]
    # The durable consumer then hands the same alerts out (not acknowledged before).
    outs = [c.apply(a) for a in history]
    assert _firing(c) == state
    # The old fire of n1 is stale: Alertmanager is not told to fire it again...
    assert outs[0].alertmanager == ()
    # ...but the end it already had is sent, since replaying sent nothing.
    assert [a.ends_ms for a in outs[2].alertmanager] == [2000]
    # Out of order: an end older than the fire it follows changes nothing.
    assert c.apply(_alert("node.reachable", 1200, node="n2")).alertmanager == ()
    assert _firing(c) == state


def test_one_shot_events_end_after_their_ttl() -> None:
    (event,) = Conditions(event_ttl_ms=60_000).apply(_alert("node.registered", 1000)).alertmanager
    assert event.labels["alertname"] == "GpufleetEventNodeRegistered"
    assert (event.starts_ms, event.ends_ms) == (1000, 61_000)


@pytest.mark.parametrize(
    ("text", "clean"),
    [
        ("http://ops:s3cret@hooks.example/x", "http://***@hooks.example/x"),
        ("https://hooks.example/a?token=t0k&team=ml", "https://hooks.example/a?token=***&team=***"),
        (
            "delivery to 'https://u:p@h:8443/p?k=v#f' failed",
            "delivery to 'https://***@h:8443/p?k=***#f' failed",
        ),
        (
            "nats://reader:pw@nats-1:4222, tls://nats-2:4222",
            "nats://***@nats-1:4222, tls://nats-2:4222",
        ),
        ("no url here: a=b", "no url here: a=b"),
    ],
)
def test_redact_hides_userinfo_and_query_values(text: str, clean: str) -> None:
    assert redact(text) == clean


def test_the_forwarders_log_redacts_messages_and_exceptions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = "https://ops:s3cret@hooks.example/hook?token=t0ken"
    with caplog.at_level(logging.INFO, logger=log.name):
        log.warning("delivery to %s failed", url)
        try:
            raise ValueError(f"bad answer from {url}")
        except ValueError:
            log.exception("webhook")
    assert "s3cret" not in caplog.text and "t0ken" not in caplog.text
    assert "https://***@hooks.example/hook?token=***" in caplog.text
    assert "bad answer from https://***@" in caplog.text


def test_the_fingerprint_is_alertmanagers() -> None:
    labels = {
        "alertname": "GpufleetEventDeviceUnhealthy", "severity": "warning", "pool": "pool-a",
        "node": "gpu-01.example.net", "device": "GPU-1", "cluster": "test",
    }  # fmt: skip
    # As prometheus-alertmanager 0.25 lists this alert in GET /api/v2/alerts (the
    # integration test compares with a running one).
    assert fingerprint(labels) == "e661ababf8961a8a"
    assert fingerprint({}) == "cbf29ce484222325"  # Prometheus' empty label signature


def test_a_webhook_notification_has_alertmanagers_shape() -> None:
    out = Conditions().apply(_alert("device.missing", 1000))
    body = webhook_payload(out.notified, out.status, "https://gpufleet.example")
    assert body["version"] == "4" and body["status"] == "firing"
    assert body["groupLabels"] == {"alertname": "GpufleetEventDeviceMissing"}
    assert body["commonLabels"] == dict(out.notified[0].labels)
    assert body["externalURL"] == "https://gpufleet.example"
    (alert,) = body["alerts"]
    assert alert["startsAt"] == "1970-01-01T00:00:01.000Z"
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"  # firing, as Alertmanager writes it
    # Several alerts of different names: grouped by nothing, common parts only.
    ended = Conditions().apply(_alert("node.healthy", 2000))
    body = webhook_payload(ended.notified, ended.status, "")
    assert body["groupLabels"] == {} and body["groupKey"] == "{}:{}"
    assert "alertname" not in body["commonLabels"] and body["commonLabels"]["node"] == "n1"
    assert {a["status"] for a in body["alerts"]} == {"resolved"}


def test_ended_conditions_are_forgotten_once_no_replay_can_be_older() -> None:
    c = Conditions()
    day = 86_400_000
    c.apply(_alert("node.unreachable", 1000, node="still-down"))
    for n in range(600):
        c.apply(_alert("node.unreachable", 2000 + n, node=f"n{n}"))
        c.apply(_alert("node.reachable", 3000 + n, node=f"n{n}"))
    assert len(c) == 601
    # A week and more later, the next pruning keeps only what still fires, and later.
    for n in range(1000):
        c.apply(_alert("node.registered", 9 * day + n))
    assert len(c) == 1
    assert _firing(c) == [("GpufleetEventNodeUnreachable", "still-down", 1000)]


def test_an_idle_reservation_fires_until_in_use_and_gpu_misuse_is_a_warning_condition() -> None:
    c = Conditions()
    idle = msgspec.structs.replace(_alert("reservation.idle", 1000), reservation_id="rsv_1")
    fired = c.apply(idle)
    assert fired.alertmanager[0].labels["alertname"] == "GpufleetEventReservationIdle"
    assert fired.alertmanager[0].labels["reservation"] == "rsv_1"
    assert fired.alertmanager[0].ends_ms is None
    busy = msgspec.structs.replace(_alert("reservation.inUse", 2000), reservation_id="rsv_1")
    (resolved,) = c.apply(busy).alertmanager
    assert (resolved.labels["alertname"], resolved.ends_ms) == (
        "GpufleetEventReservationIdle",
        2000,
    )
    for kind, name in (
        ("gpu.unbookedUse", "GpufleetEventGpuUnbookedUse"),
        ("gpu.foreignUse", "GpufleetEventGpuForeignUse"),
    ):
        # A coordinator before issue 34 said it as a one-shot event (no `details.ends`):
        # replayed from the stream's history after an upgrade, it still expires.
        (old,) = c.apply(_alert(kind, 2500, node="n0")).alertmanager
        assert old.ends_ms == 2500 + c.event_ttl_ms and old.labels["severity"] == "warning"
        start = msgspec.structs.replace(_alert(kind, 3000), details={"ends": kind + "Ended"})
        (event,) = c.apply(start).alertmanager
        assert (event.labels["alertname"], event.labels["severity"]) == (name, "warning")
        # A condition (issue 34): firing, re-sent, until its end arrives; never expiring.
        assert event.ends_ms is None
        assert name in [a.labels["alertname"] for a in c.firing()]
        (ended,) = c.apply(_alert(kind + "Ended", 4000)).alertmanager
        assert (ended.labels, ended.starts_ms, ended.ends_ms) == (event.labels, 3000, 4000)
        assert name not in [a.labels["alertname"] for a in c.firing()]


def test_use_alerts_carry_tenant_and_owner_and_end_whatever_the_holders_became() -> None:
    c = Conditions()
    start = msgspec.structs.replace(
        _alert("gpu.foreignUse", 1000), device_id="GPU-0",
        details={
            "ownerKind": "pod", "owner": "ml/train-0", "holderTenantIds": ["acme"],
            "poolName": "training", "ends": "gpu.foreignUseEnded",
        },
    )  # fmt: skip
    (fired,) = c.apply(start).alertmanager
    assert fired.labels["tenant"] == "acme" and fired.labels["owner_kind"] == "pod"
    assert fired.labels["pool_name"] == "training" and fired.labels["pool"] == "p"
    assert "(pool training)" in fired.annotations["summary"]
    assert fired.labels["owner"] == "pod:ml/train-0"
    # The holder released its GPU meanwhile: the end names no tenant, and still resolves.
    end = msgspec.structs.replace(
        _alert("gpu.foreignUseEnded", 2000), device_id="GPU-0",
        details={"ownerKind": "pod", "owner": "ml/train-0", "holderTenantIds": []},
    )  # fmt: skip
    (resolved,) = c.apply(end).alertmanager
    assert (resolved.labels, resolved.ends_ms) == (fired.labels, 2000)
    unbooked = msgspec.structs.replace(
        _alert("gpu.unbookedUse", 3000), device_id="GPU-1",
        details={
            "pids": [7], "owners": [{"pid": 7, "owner": "42", "ownerKind": "slurm"}],
            "ends": "gpu.unbookedUseEnded",
        },
    )  # fmt: skip
    (fired,) = c.apply(unbooked).alertmanager
    assert (fired.labels["owner_kind"], fired.labels["owner_name"]) == ("slurm", "slurm:42")
    assert "pid 7 (slurm 42)" in fired.annotations["description"]
    # Where the agent read a name (a pod's namespace/name), it is the one shown.
    named = msgspec.structs.replace(
        unbooked, device_id="GPU-3",
        details={"owners": [{"pid": 8, "owner": "uid-9", "ownerKind": "pod",
                             "ownerName": "ml/train-1"}], "ends": "gpu.unbookedUseEnded"},
    )  # fmt: skip
    (fired,) = c.apply(named).alertmanager
    assert fired.labels["owner_name"] == "pod:ml/train-1"
    assert "pid 8 (pod ml/train-1)" in fired.annotations["description"]
    # A container (Docker, containerd, Podman) by the name its runtime gave it.
    boxed = msgspec.structs.replace(
        unbooked, device_id="GPU-4",
        details={"owners": [{"pid": 9, "owner": "c" * 64, "ownerKind": "container",
                             "ownerName": "trainer"}], "ends": "gpu.unbookedUseEnded"},
    )  # fmt: skip
    (fired,) = c.apply(boxed).alertmanager
    assert (fired.labels["owner_kind"], fired.labels["owner_name"]) == (
        "container",
        "container:trainer",
    )
    assert "pid 9 (container trainer)" in fired.annotations["description"]


def test_a_reservation_at_risk_for_a_fault_of_its_gpu_pages() -> None:
    c = Conditions()

    def risk(rid: str, reason: str) -> Alert:
        return msgspec.structs.replace(
            _alert("reservation.atRisk", 1000), reservation_id=rid,
            details={"tenantId": "acme", "reason": reason},
        )  # fmt: skip

    (xid,) = c.apply(risk("rsv_1", "unhealthy")).alertmanager
    (drain,) = c.apply(risk("rsv_2", "maintenance")).alertmanager
    assert (xid.labels["severity"], drain.labels["severity"]) == ("critical", "warning")
    assert xid.labels["tenant"] == "acme"
    back = msgspec.structs.replace(_alert("reservation.recovered", 2000), reservation_id="rsv_1")
    (resolved,) = c.apply(back).alertmanager
    assert (resolved.labels["severity"], resolved.ends_ms) == ("critical", 2000)


def test_foreign_use_by_owners_with_no_reservation_stays_apart_in_alertmanager() -> None:
    """A pod and a Slurm job on one booked GPU are two alerts, not one that the second
    overwrites: the owner is a label where no reservation names it."""
    c = Conditions()

    def foreign(at: int, kind: str, owner: str) -> Alert:
        return msgspec.structs.replace(
            _alert("gpu.foreignUse", at),
            device_id="GPU-0",
            details={"ownerKind": kind, "owner": owner, "holders": ["rsv_1"]},
        )

    (pod,) = c.apply(foreign(1000, "pod", "uid-1")).alertmanager
    (job,) = c.apply(foreign(1000, "slurm", "42")).alertmanager
    (nobody,) = c.apply(foreign(1000, "unknown", "")).alertmanager
    assert [a.labels.get("owner") for a in (pod, job, nobody)] == [
        "pod:uid-1",
        "slurm:42",
        "unknown",
    ]
    assert len({pod.key(), job.key(), nobody.key()}) == 3
    other = msgspec.structs.replace(foreign(1000, "reservation", "rsv_2"), reservation_id="rsv_2")
    (named,) = c.apply(other).alertmanager
    assert named.labels["reservation"] == "rsv_2" and "owner" not in named.labels
