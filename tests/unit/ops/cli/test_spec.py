"""The CLI's copy of the API (ops/cli/openapi.json) is the registry's, and every method is
reachable with flags: `gpufleet api METHOD --flag …` builds the body the API expects."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from coordinator.api.http.openapi import build_openapi
from coordinator.api.methods import REGISTRY
from ops.cli import api_spec
from ops.cli.api_commands import ApiGroup
from ops.cli.flags import BadValue, body_from, parse_when
from ops.main import cli

SPEC = Path(api_spec.__file__).with_name(api_spec.SPEC_FILE)


def test_committed_openapi_is_the_registrys() -> None:
    want = api_spec.render_document(build_openapi(REGISTRY, api_spec.API_VERSION))
    assert SPEC.read_text() == want, "run: scripts/openapi"


def test_every_compute_method_is_a_command_with_a_flag_per_field() -> None:
    group = cli.commands["api"]
    assert isinstance(group, ApiGroup)
    ctx = click.Context(group)
    compute = [m for m in REGISTRY if m.convention == "compute"]
    assert sorted(group.list_commands(ctx)) == sorted(m.name for m in compute)
    for method in compute:
        command = group.get_command(ctx, method.name)
        assert command is not None, method.name
        flags = {opt for p in command.params for opt in getattr(p, "opts", [])}
        for name, field in method.input.model_fields.items():
            alias = field.alias or name
            spec = api_spec.methods()[method.name].param(alias)
            assert spec is not None and spec.flag in flags, (method.name, alias)


def test_flags_become_the_body_the_api_expects() -> None:
    spec = api_spec.methods()["reservations.create"]
    body = body_from(
        spec,
        {
            "tenantId": "acme",
            "poolId": "pool_" + "0" * 26,
            "devices": ("class=gpu,count=4,topology=nvlink-all", '{"class": "nic.vf", "count": 1}'),
            "duration": "2h",
            "spot": True,
            "resources": "vcpu=8,memoryGiB=64",
            "start": "2030-01-01T00:00:00Z",
        },
        {"idempotencyKey": "k1"},
    )
    assert body == {
        "idempotencyKey": "k1",
        "tenantId": "acme",
        "poolId": "pool_" + "0" * 26,
        "devices": [
            {"class": "gpu", "count": 4, "topology": "nvlink-all"},
            {"class": "nic.vf", "count": 1},
        ],
        "duration": "2h",
        "spot": True,
        "resources": {"vcpu": 8, "memoryGiB": 64},
        "start": 1_893_456_000_000,
    }
    listed = body_from(api_spec.methods()["reservations.list"], {"state": ("active,noticed",)}, {})
    assert listed == {"state": ["active", "noticed"]}
    with pytest.raises(BadValue, match="not one of"):
        body_from(api_spec.methods()["reservations.list"], {"state": ("running",)}, {})
    with pytest.raises(BadValue, match="unknown key 'cores'"):
        body_from(spec, {"resources": "cores=8"}, {})


def test_times_are_rfc3339_dates_offsets_or_epoch_ms() -> None:
    now = 1_800_000_000_000
    assert parse_when("now", now) == now
    assert parse_when("-7d", now) == now - 7 * 86_400_000
    assert parse_when("now+30m", now) == now + 1_800_000
    assert parse_when("1700000000000", now) == 1_700_000_000_000
    assert parse_when("2026-01-01", now) == 1_767_225_600_000
    assert parse_when("2026-01-01T01:00:00+01:00", now) == 1_767_225_600_000
    with pytest.raises(BadValue, match="no UTC offset"):
        parse_when("2026-01-01T00:00:00", now)
    with pytest.raises(BadValue, match="not a time"):
        parse_when("yesterday", now)


def test_time_flags_take_whole_milliseconds_only_whatever_the_digits() -> None:
    now, day = 1_800_000_000_000, 1_767_225_600_000  # 2026-01-01T00:00:00Z
    assert parse_when("2026-01-01T00:00:00.123Z", now) == day + 123
    assert parse_when("2026-01-01T00:00:00.1Z", now) == day + 100
    assert parse_when("2026-01-01T00:00:00.123000000Z", now) == day + 123
    assert parse_when("now+0.5s", now) == now + 500
    assert parse_when("-1.5h", now) == now - 5_400_000
    for off in ("0000001", "000000999", "1234"):
        with pytest.raises(BadValue, match="fraction below the millisecond"):
            parse_when(f"2026-01-01T00:00:00.{off}Z", now)
    with pytest.raises(BadValue, match="whole number of milliseconds"):
        parse_when("+0.0001s", now)
