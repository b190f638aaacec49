"""Ingest's fast decoder of the common heartbeat (coordinator/bus/beat.py) never accepts
what the wire model refuses, and gives the same values when it accepts; ingest sends
everything else to the model, so a bad heartbeat is refused for the model's reasons
whichever way it came."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from coordinator.bus import beat
from coordinator.bus.ingest import Ingest
from coordinator.domain.liveness import HeartbeatFacts, as_heartbeat
from shared.ids import new_pool_id
from shared.subjects import Subjects
from shared.wire import DeviceHealth, Heartbeat, Inventory, NodeHealth

POOL = new_pool_id()
SUBJECTS = Subjects("t")


def _common(**changes: Any) -> dict[str, Any]:
    hb = Heartbeat(
        node_id="gpu-1", pool_id=POOL, boot_id="b1", seq=7, sent_at=1_796_032_304_276,
        interval_ms=5000, inventory_hash="h" * 64, health=NodeHealth(status="healthy"),
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(hb.to_json())
    doc.update(changes)
    return doc


class Recording:
    def __init__(self) -> None:
        self.beats: list[HeartbeatFacts] = []

    def on_heartbeat(self, hb: HeartbeatFacts) -> None:
        self.beats.append(hb)

    def on_inventory(self, inv: Inventory) -> None:
        raise AssertionError("no inventory here")


def _ingest(payload: bytes, node: str = "gpu-1") -> tuple[Ingest, Recording]:
    sink = Recording()
    ingest = Ingest(SUBJECTS, sink)
    ingest.handle(SUBJECTS.heartbeat(POOL, node), payload)
    return ingest, sink


def test_the_agents_common_heartbeat_takes_the_fast_path_with_the_models_values() -> None:
    raw = json.dumps(_common(health={"status": "degraded", "reasons": ["ecc"]})).encode()
    _, sink = _ingest(raw)
    [got] = sink.beats
    assert isinstance(got, beat.Beat)
    assert as_heartbeat(got) == Heartbeat.model_validate_json(raw)


def test_a_heartbeat_with_devices_is_the_models() -> None:
    device = DeviceHealth(device_id="GPU-1", status="unhealthy", reasons=("xid 79",))
    raw = json.dumps(_common(devices=[json.loads(device.to_json())])).encode()
    _, sink = _ingest(raw)
    [got] = sink.beats
    assert isinstance(got, Heartbeat) and got.devices == (device,)


@pytest.mark.parametrize(
    "changes",
    [
        {"bootId": "b" * 65},
        {"bootId": "b\x00"},
        {"seq": 2**63},
        {"seq": -1},
        {"sentAt": 2**64},
        {"intervalMs": 99},
        {"intervalMs": 3_600_001},
        {"inventoryHash": "x" * 129},
        {"health": {"status": "fine"}},
        {"health": {"status": "healthy", "reasons": ["r\x00"]}},
        {"health": {"status": "healthy", "reasons": ["r"] * 65}},
        {"schemaVersion": 2**31},
        {"provisioning": "maybe"},
        {"nodeId": "gpu-1\n"},
        {"devices": [{"deviceId": "d" * 129, "status": "unhealthy"}]},
    ],
)
def test_out_of_bounds_heartbeats_are_refused_as_schema_errors(changes: dict[str, Any]) -> None:
    ingest, sink = _ingest(json.dumps(_common(**changes)).encode())
    assert sink.beats == []
    assert ingest.dropped.keys() <= {"bad_schema", "subject_mismatch"} and ingest.dropped


def test_a_subject_whose_ids_are_malformed_is_refused_even_when_the_payload_agrees() -> None:
    raw = json.dumps(_common(nodeId="gpu 1")).encode()
    ingest, sink = _ingest(raw, node="gpu 1")
    assert sink.beats == [] and ingest.dropped == {"bad_schema": 1}


def test_lenient_forms_the_model_coerces_are_still_accepted() -> None:
    # The model's JSON mode takes these; the fast path does not, and hands them on.
    for changes in ({"seq": "7"}, {"intervalMs": 5000.0}, {"provisioning": "false"}):
        raw = json.dumps(_common(**changes)).encode()
        _, sink = _ingest(raw)
        [got] = sink.beats
        assert isinstance(got, Heartbeat) and got == Heartbeat.model_validate_json(raw)


# -- the contract, over generated payloads --------------------------------------------

TEXT = st.one_of(
    st.text(max_size=3),
    st.text(max_size=140),
    st.sampled_from(["", "b1", "\x00", "a\x00", "é" * 64, "é" * 65, "x" * 128, "x" * 129]),
)
INT = st.one_of(
    st.integers(-2, 2**64),
    st.sampled_from([0, 99, 100, 3_600_000, 3_600_001, 2**31 - 1, 2**31, 2**63 - 1, 2**63]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(max_size=4),
)
ANY = st.one_of(st.none(), st.booleans(), INT, TEXT, st.lists(TEXT, max_size=3))
STATUS = st.one_of(st.sampled_from(["healthy", "degraded", "unhealthy", "unmonitored"]), TEXT)
HEALTH = st.one_of(
    st.fixed_dictionaries(
        {"status": STATUS},
        optional={"reasons": st.one_of(st.lists(TEXT, max_size=66), ANY)},
    ),
    ANY,
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "schemaVersion": INT,
    "nodeId": st.one_of(st.just("gpu-1"), TEXT),
    "poolId": st.one_of(st.just(POOL), TEXT),
    "bootId": TEXT,
    "seq": INT,
    "sentAt": INT,
    "intervalMs": INT,
    "inventoryHash": TEXT,
    "provisioning": st.one_of(st.booleans(), ANY),
    "health": HEALTH,
    "devices": st.one_of(st.just([]), ANY),
    "busErrors": INT,
    # snake_case names (the model takes them too) and unknown fields
    "node_id": TEXT,
    "interval_ms": INT,
    "extra": ANY,
}


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    doc = _common()
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        if draw(st.integers(0, 5)) == 0:
            doc.pop(name, None)
        else:
            doc[name] = draw(FIELDS[name])
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    if draw(st.integers(0, 5)) == 0:  # a duplicate key: the last one counts, for both
        name = draw(st.sampled_from(sorted(FIELDS)))
        text = text[:-1] + f", {json.dumps(name)}: {json.dumps(draw(FIELDS[name]))}}}"
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads())
def test_what_the_fast_decoder_accepts_the_model_accepts_with_the_same_values(raw: bytes) -> None:
    fast = beat.decode(raw, POOL, "gpu-1")
    if fast is None:
        return
    try:
        model = Heartbeat.model_validate_json(raw)
    except ValidationError as exc:
        raise AssertionError(f"fast path accepted what the model refuses: {raw!r}") from exc
    assert as_heartbeat(fast) == model


SAFE_TEXT = st.characters(codec="utf-8", exclude_characters="\x00")
AGENT_HEARTBEATS = st.fixed_dictionaries(
    {
        "schema_version": st.integers(0, 2**31 - 1),
        "node_id": st.just("gpu-1"),
        "pool_id": st.just(POOL),
        "boot_id": st.text(SAFE_TEXT, max_size=64),
        "seq": st.integers(0, 2**63 - 1),
        "sent_at": st.integers(0, 2**63 - 1),
        "interval_ms": st.integers(100, 3_600_000),
        "inventory_hash": st.text(SAFE_TEXT, max_size=128),
        "provisioning": st.booleans(),
        "bus_errors": st.integers(0, 2**63 - 1),
        "health": st.fixed_dictionaries(
            {
                "status": st.sampled_from(["healthy", "degraded", "unhealthy", "unmonitored"]),
                "reasons": st.lists(st.text(SAFE_TEXT, max_size=20), max_size=3),
            }
        ),
    }
).map(lambda fields: Heartbeat(**fields))


@settings(max_examples=300, deadline=None)
@given(AGENT_HEARTBEATS)
def test_every_heartbeat_an_agent_writes_without_devices_takes_the_fast_path(
    hb: Heartbeat,
) -> None:
    fast = beat.decode(hb.to_json(), POOL, "gpu-1")
    assert fast is not None
    assert as_heartbeat(fast) == hb
