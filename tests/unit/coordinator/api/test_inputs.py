"""What the API refuses before any workflow runs, below HTTP.

Compute convention: each method's input model, decoded as the server decodes a body
(`model_validate_json`), and the one function that words a validation failure
(`invalid_input`): `INVALID_INPUT`, 400, naming every failing field by its path.
Seed 002: the pure parsers that hold the seed's validation table, in its words.

That these answers reach the wire is shown once per convention, over HTTP:
integration/coordinator/api/test_capacity.py::test_bad_bodies_reach_the_wire_as_invalid_input_envelopes_not_500
and test_intervals.py::test_the_seeds_400s_reach_the_wire_as_plain_text.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from coordinator.api.http.render import error_body
from coordinator.api.http.server import field_path, invalid_input
from coordinator.api.methods import REGISTRY
from coordinator.api.shapes.reservation_input import ReservationCreateInput
from coordinator.domain.errors import InvalidInput
from coordinator.domain.intervals import (
    LIST_DEFAULT_LIMIT,
    LIST_MAX_LIMIT,
    IntervalError,
    parse_intervals,
    parse_limit,
    parse_window,
)
from coordinator.domain.timeline import TimelineError, resolve_window

T0 = 1_800_000_000_000  # on the 15-minute grid
Q = 900_000
DAY = 86_400_000
POOL = "pool_" + "0" * 26


def refusal(method: str, body: Any) -> InvalidInput:
    """What the server makes of `body` sent to `method`, which must fail validation."""
    found = REGISTRY.get(method)
    assert found is not None and found.convention == "compute", method
    with pytest.raises(ValidationError) as info:
        found.input.model_validate_json(json.dumps(body))
    return invalid_input(info.value)


def paths(err: InvalidInput) -> list[str]:
    return [f["path"] for f in err.details["fields"]]


def accepts(method: str, body: Any) -> None:
    found = REGISTRY.get(method)
    assert found is not None
    found.input.model_validate_json(json.dumps(body))


# -- the envelope's words, in one place ---------------------------------------------


def test_a_validation_failure_is_invalid_input_400_naming_each_field_once() -> None:
    err = refusal("capacity.byPool", {"tenantId": "bad tenant", "poolId": None, "x": 1})
    assert (err.status, err.code) == (400, "INVALID_INPUT")
    assert err.message == "invalid input: tenantId, poolId, x"
    for field in err.details["fields"]:
        assert set(field) == {"path", "message", "type"} and field["message"]
    assert error_body(err.code, err.message, err.details) == {
        "error": {"code": "INVALID_INPUT", "message": err.message, "details": err.details}
    }


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("devices", 0, "count"), "devices[0].count"),
        (("wait", "timeoutMs"), "wait.timeoutMs"),
        ((0,), "[0]"),
        ((), "(body)"),
    ],
)
def test_field_paths_read_as_the_body_is_written(loc: tuple[int | str, ...], path: str) -> None:
    assert field_path(loc) == path


# -- capacity.summary / capacity.byPool ---------------------------------------------

CAPACITY_BAD = [
    ("capacity.summary", {}, "tenantId"),
    ("capacity.summary", {"tenantId": "a" * 129}, "tenantId"),
    ("capacity.summary", {"tenantId": "bad tenant"}, "tenantId"),
    ("capacity.summary", {"tenantId": ""}, "tenantId"),
    ("capacity.summary", {"tenantId": 42}, "tenantId"),
    ("capacity.summary", {"tenantId": "acme", "extra": 1}, "extra"),
    ("capacity.byPool", {"tenantId": "acme"}, "poolId"),
    ("capacity.byPool", {"poolId": POOL}, "tenantId"),
    ("capacity.byPool", {"tenantId": "acme", "poolId": "pool_" + "0" * 53}, "poolId"),
    ("capacity.byPool", {"tenantId": "acme", "poolId": "pool_" + "0" * 25}, "poolId"),
    ("capacity.byPool", {"tenantId": "acme", "poolId": "pool_" + "U" * 26}, "poolId"),
    ("capacity.byPool", {"tenantId": "acme", "poolId": "prj_" + "0" * 26}, "poolId"),
    ("capacity.byPool", {"tenantId": "acme", "poolId": None}, "poolId"),
]


@pytest.mark.parametrize(("method", "body", "field"), CAPACITY_BAD)
def test_every_capacity_constraint_names_its_field(
    method: str, body: dict[str, Any], field: str
) -> None:
    assert field in paths(refusal(method, body))


def test_the_capacity_inputs_accept_what_the_seed_allows() -> None:
    accepts("capacity.summary", {"tenantId": "a" * 128})
    accepts("capacity.byPool", {"tenantId": "acme", "poolId": POOL})


# -- reservations.create and capacity.preview (one input model) ----------------------


def reservation(**extra: Any) -> dict[str, Any]:
    return {
        "tenantId": "acme",
        "poolId": POOL,
        "devices": [{"class": "gpu", "count": 1}],
        "duration": "1h",
        "idempotencyKey": "v",
    } | extra


RESERVATION_BAD = [
    ({"devices": []}, "devices"),
    ({"devices": [{"class": "gpu", "count": 1}] * 9}, "devices"),
    ({"devices": [{"class": "gpu", "count": 0}]}, "devices[0].count"),
    ({"devices": [{"class": "gpu", "count": 65}]}, "devices[0].count"),
    ({"devices": [{"class": "tpu", "count": 1}]}, "devices[0].class"),
    ({"devices": [{"class": "gpu", "count": 1, "sharing": "mig"}]}, "devices[0].sharing"),
    ({"devices": [{"class": "gpu", "count": 1, "topology": "ring"}]}, "devices[0].topology"),
    ({"topology": "mesh"}, "topology"),
    ({"duration": "2x"}, "duration"),
    ({"duration": 0}, "duration"),
    ({"duration": 1.5}, "duration"),
    ({"start": -1}, "start"),
    ({"start": 140737488355329}, "start"),
    ({"binding": "rack"}, "binding"),
    ({"resources": {"vcpu": 4097}}, "resources.vcpu"),
    ({"resources": {"memoryGiB": 65537}}, "resources.memoryGiB"),
    ({"resources": {"hugepages1Gi": -1}}, "resources.hugepages1Gi"),
    ({"node": {"profileVersion": 1}}, "node.profileId"),
    ({"node": {"profileId": "x y"}}, "node.profileId"),
    ({"node": {"profileId": "p", "profileVersion": 0}}, "node.profileVersion"),
    ({"leaseSeconds": 29}, "leaseSeconds"),
    ({"leaseSeconds": 86401}, "leaseSeconds"),
    ({"spot": "yes"}, "spot"),
    ({"idempotencyKey": "bad key"}, "idempotencyKey"),
    ({"idempotencyKey": "k" * 129}, "idempotencyKey"),
    ({"wait": {}}, "wait.timeoutMs"),
    ({"wait": {"timeoutMs": 30001}}, "wait.timeoutMs"),
    ({"gang": {"size": 1}}, "gang.size"),
    ({"gang": {"size": 65}}, "gang.size"),
    ({"gang": {"size": 2, "topologyKey": "k" * 129}}, "gang.topologyKey"),
    ({"projectId": "proj_1"}, "projectId"),
    ({"poolId": "pool_x"}, "poolId"),
]


@pytest.mark.parametrize("method", ["reservations.create", "capacity.preview"])
@pytest.mark.parametrize(("patch", "field"), RESERVATION_BAD)
def test_create_and_preview_refuse_every_seed_constraint(
    method: str, patch: dict[str, Any], field: str
) -> None:
    assert field in paths(refusal(method, reservation(**patch)))


def test_create_and_preview_both_need_an_idempotency_key() -> None:
    """Seed 000: preview's input is create's, validated the same way, idempotencyKey
    included (required in its table)."""
    body = reservation()
    del body["idempotencyKey"]
    for method in ("reservations.create", "capacity.preview"):
        assert paths(refusal(method, body))[0] == "idempotencyKey"
        accepts(method, reservation())


@pytest.mark.parametrize(
    ("duration", "ms"),
    [("90m", 5400), ("2h", 7200), ("1d", 86400), ("PT2H", 7200), ("P1DT30M", 88200), (600, 600)],
)
def test_durations_in_every_accepted_spelling(duration: Any, ms: int) -> None:
    for method in ("reservations.create", "capacity.preview"):
        assert REGISTRY.get(method) is not None
        assert issubclass(REGISTRY.get(method).input, ReservationCreateInput)  # type: ignore[union-attr]
    body = ReservationCreateInput.model_validate_json(json.dumps(reservation(duration=duration)))
    assert body.duration_ms == ms * 1000


# -- capacity.timeline: the model's bounds, then the window's ------------------------


@pytest.mark.parametrize(
    ("patch", "field"),
    [({"stepMinutes": 4}, "stepMinutes"), ({"stepMinutes": 1441}, "stepMinutes"),
     ({"from": -5}, "from")],
)  # fmt: skip
def test_timeline_input_bounds(patch: dict[str, Any], field: str) -> None:
    assert field in paths(
        refusal("capacity.timeline", {"tenantId": "acme", "poolId": POOL} | patch)
    )


HOUR = T0 - T0 % 3_600_000


@pytest.mark.parametrize(
    ("start", "end", "step", "field"),
    [
        (HOUR, HOUR, None, "to"),
        (HOUR, HOUR + 8 * DAY, None, "to"),
        (HOUR, HOUR + 7 * DAY, 5, "stepMinutes"),
    ],
)
def test_timeline_window_rules_name_their_field(
    start: int, end: int, step: int | None, field: str
) -> None:
    with pytest.raises(TimelineError) as info:
        resolve_window(T0, start, end, step)
    assert info.value.field == field


def test_the_timeline_window_defaults_and_its_largest() -> None:
    window = resolve_window(T0, None, None, None)
    assert (window.start, window.end, window.step_ms) == (HOUR, HOUR + DAY, 3_600_000)
    week = resolve_window(T0, HOUR, HOUR + 7 * DAY, 30)
    assert (week.end - week.start) // week.step_ms == 336


# -- quotas.set, nodes.setMaintenance -------------------------------------------------


def test_quota_resource_and_limit_are_checked() -> None:
    bad_resource = {"tenantId": "acme", "resource": "gpus", "limit": 4}
    assert paths(refusal("quotas.set", bad_resource))[0] == "resource"
    assert "limit" in paths(
        refusal("quotas.set", {"tenantId": "acme", "resource": "gpu", "limit": -1})
    )
    accepts("quotas.set", {"tenantId": "acme", "resource": "gpu", "limit": 0})


def test_entering_maintenance_needs_a_reason_leaving_does_not() -> None:
    err = refusal("nodes.setMaintenance", {"nodeId": "a1", "maintenance": True})
    assert paths(err) == ["(body)"] and "reason" in err.details["fields"][0]["message"]
    refusal("nodes.setMaintenance", {"nodeId": "a1", "maintenance": True, "reason": "  "})
    accepts("nodes.setMaintenance", {"nodeId": "a1", "maintenance": False})


# -- seed 002: POST /api/capacity/reservations's validation table --------------------


def iso(ms: int, offset: str = "Z") -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + offset


def iv(k: int, gb: int = 16) -> dict[str, Any]:
    """The k-th quarter after T0 + 1 h."""
    start = T0 + 3_600_000 + k * Q
    return {"startsAt": iso(start), "endsAt": iso(start + Q), "capacityGb": gb}


def _bad_bodies() -> list[tuple[Any, str]]:
    start = T0 + 3_600_000
    one = iv(0)
    skewed = {"startsAt": iso(start + 300_000), "endsAt": iso(start + Q + 300_000)}
    soon = {"startsAt": iso(T0 + Q), "endsAt": iso(T0 + 2 * Q), "capacityGb": 4}
    return [
        ({"intervals": [one | skewed]}, "aligned"),
        ({"intervals": [one | {"endsAt": iso(start + 2 * Q)}]}, "startsAt + 15 minutes"),
        ({"intervals": [one | {"capacityGb": 0}]}, "multiple of 4"),
        ({"intervals": [one | {"capacityGb": -4}]}, "multiple of 4"),
        ({"intervals": [one | {"capacityGb": 6}]}, "multiple of 4"),
        ({"intervals": [one | {"capacityGb": "8"}]}, "multiple of 4"),
        ({"intervals": [one | {"capacityGb": True}]}, "multiple of 4"),
        ({"intervals": [one | {"capacityGb": 8.0}]}, "multiple of 4"),
        ({"intervals": [soon]}, "30 minutes"),
        ({"intervals": [one, one]}, "duplicate"),
        ({"intervals": [iv(k) for k in range(673)]}, "at most 672"),
        ({"intervals": []}, "non-empty"),
        ({}, "intervals"),
        ({"intervals": [one | {"startsAt": "2027-01-15T10:00:00"}]}, "RFC 3339"),
        ({"intervals": [one | {"startsAt": "tomorrow"}]}, "RFC 3339"),
        ({"intervals": [one | {"note": "x"}]}, "unknown"),
        ({"intervals": [one], "cancel": True}, "unknown"),
        ([one], "JSON object"),
    ]


@pytest.mark.parametrize(("body", "words"), _bad_bodies())
def test_every_rule_of_the_interval_table_is_refused_in_the_seeds_words(
    body: Any, words: str
) -> None:
    with pytest.raises(IntervalError) as info:
        parse_intervals(json.loads(json.dumps(body)), T0)
    assert words in str(info.value)


def test_intervals_in_any_offset_are_read_in_utc() -> None:
    start = T0 + 3_600_000
    shifted = {
        "startsAt": iso(start + 7_200_000, "+02:00"),
        "endsAt": iso(start + 7_200_000 + Q, "+02:00"),
        "capacityGb": 4,
    }
    [parsed] = parse_intervals({"intervals": [shifted]}, T0)
    assert (parsed.starts_at, parsed.ends_at, parsed.capacity_gb) == (start, start + Q, 4)


# -- seed 002: the audit list's and the calendar's windows ---------------------------


@pytest.mark.parametrize(
    ("frm", "to", "grid", "words"),
    [
        (iso(T0), None, False, "required"),
        (None, iso(T0), True, "required"),
        (iso(T0), iso(T0 + 36 * DAY), False, "35 days"),
        (iso(T0), iso(T0 + 36 * DAY), True, "35 days"),
        (iso(T0), iso(T0), False, "after from"),
        (iso(T0 + 60_000), iso(T0 + Q), True, "15-minute"),
    ],
)
def test_window_rules(frm: str | None, to: str | None, grid: bool, words: str) -> None:
    with pytest.raises(IntervalError) as info:
        parse_window(frm, to, grid=grid)
    assert words in str(info.value)


def test_windows_off_the_grid_are_fine_for_the_audit_list() -> None:
    assert parse_window(iso(T0 + 1000), iso(T0 + 2000), grid=False) == (T0 + 1000, T0 + 2000)


def _sub_ms(ms: int) -> str:
    """A time a tenth of a millisecond past `ms`: on the grid only if truncated."""
    return iso(ms)[:-1] + ".0001Z"


def test_sub_millisecond_times_are_misaligned_not_truncated() -> None:
    """SPEC §5: a fraction below the millisecond is off the grid, never truncated onto
    it, in both the reservation body and the calendar window."""
    start = T0 + 3_600_000
    body = {"intervals": [iv(0) | {"startsAt": _sub_ms(start)}]}
    with pytest.raises(IntervalError) as info:
        parse_intervals(body, T0)
    assert "intervals[0].startsAt: not aligned" in str(info.value)
    with pytest.raises(IntervalError) as info:
        parse_window(_sub_ms(T0), iso(T0 + Q), grid=True)
    assert "15-minute" in str(info.value)
    with pytest.raises(IntervalError) as info:
        parse_window(iso(T0), _sub_ms(T0 + Q), grid=False)
    assert "to: " in str(info.value) and "millisecond" in str(info.value)
    # Whole milliseconds with more digits are still the same instant.
    assert parse_window(iso(T0)[:-1] + ".000000Z", iso(T0 + Q), grid=True) == (T0, T0 + Q)


@pytest.mark.parametrize("raw", ["0", "-1", "x"])
def test_a_limit_below_one_or_not_a_number_is_refused(raw: str) -> None:
    with pytest.raises(IntervalError):
        parse_limit(raw)


def test_a_limit_above_the_most_is_clamped_not_refused() -> None:
    assert parse_limit("5000") == LIST_MAX_LIMIT
    assert parse_limit(None) == LIST_DEFAULT_LIMIT
