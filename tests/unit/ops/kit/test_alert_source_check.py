"""What `AlertSource` counts as its consumer changed behind its back (issue 32): each way
a rewrite could make it forward nothing, and none of what a recreation moves on purpose
(where it starts)."""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig

from ops.kit.alerts import AlertSource, ConsumerSpec

SPEC = ConsumerSpec("GPUFLEET_ALERTS", "gpufleet.alert.>", "alert-forwarder", 30.0, 1000)


def as_server_has_it(**changes: object) -> ConsumerConfig:
    """Our config as nats-server answers it (its defaults filled in), then `changes`."""
    raw = {
        "name": "alert-forwarder", "durable_name": "alert-forwarder",
        "deliver_policy": "by_start_sequence", "opt_start_seq": 42, "ack_policy": "explicit",
        "ack_wait": 30_000_000_000, "max_deliver": -1, "filter_subject": "gpufleet.alert.>",
        "replay_policy": "instant", "max_ack_pending": 1000, "max_waiting": 512,
        "num_replicas": 0,
    } | changes  # fmt: skip
    return ConsumerConfig.from_response(raw)


def test_our_own_consumer_from_any_start_is_no_change() -> None:
    source = AlertSource(Client(), SPEC, wait_s=1)
    assert source.differences(as_server_has_it()) == []
    assert source.differences(as_server_has_it(deliver_policy="all", opt_start_seq=None)) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"filter_subject": "gpufleet.alert.nothing.nothing.nothing"}, "filter_subject"),
        ({"inactive_threshold": 10 * 365 * 86400 * 10**9}, "inactive_threshold"),
        ({"deliver_subject": "gpufleet.bookings.p.n"}, "deliver_subject"),
        ({"ack_policy": "none"}, "ack_policy"),
        ({"ack_wait": 10**9}, "ack_wait"),
        ({"max_ack_pending": 1}, "max_ack_pending"),
        ({"max_deliver": 1}, "max_deliver"),
        ({"headers_only": True}, "headers_only"),
        ({"filter_subject": None, "filter_subjects": ["x.>"]}, "filter_subjects"),
    ],
)
def test_each_rewrite_that_would_silence_it_is_found(change: dict[str, object], named: str) -> None:
    source = AlertSource(Client(), SPEC, wait_s=1)
    found = source.differences(as_server_has_it(**change))
    assert found and any(d.startswith(f"{named}=") for d in found), found
