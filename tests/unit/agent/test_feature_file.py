"""The Node Feature Discovery feature file, checked against NFD's documented syntax for
its `local` source (docs/usage/customization-guide.md, "Local feature source"): lines
`<namespace>/<name>[=<value>]`, `#` comments, a `# +expiry-time=<RFC 3339>` directive,
at most 64 KiB, written as a dot-file (which NFD skips) then renamed; and Kubernetes'
label rules for the names and values (a DNS-subdomain prefix; a name and a value of at
most 63 characters, alphanumeric at both ends, `-_.` between; the value may be empty)."""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from agent.feature_file import MAX_BYTES, FeatureFile, features, label_value, render
from agent.state import AgentState
from shared.wire import BookedDevice, NodeBooking, NodeBookings, NodeHealth
from tests.factories import make_inventory

PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
NOW = 1_800_000_000_000
POOL = "pool_" + "a" * 26


def nfd_parse(text: str, now: datetime) -> dict[str, str]:
    """The labels NFD's local source takes from a feature file, refusing anything outside
    the documented syntax (an assertion names the offending line)."""
    assert len(text.encode()) <= 64 * 1024
    labels: dict[str, str] = {}
    expiry: datetime | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            directive = re.match(r"^# \+expiry-time=(.+)$", line)
            if directive:
                expiry = datetime.fromisoformat(directive.group(1).replace("Z", "+00:00"))
            continue
        key, _, value = line.partition("=")
        prefix, slash, name = key.partition("/")
        assert slash and PREFIX.match(prefix) and len(prefix) <= 253, line
        assert NAME.match(name) and len(name) <= 63, line
        assert VALUE.match(value) and len(value) <= 63, line
        if expiry is None or expiry > now:
            labels[key] = value or "true"
    return labels


def state(model: str = "NVIDIA H100 80GB HBM3", health: str = "healthy") -> AgentState:
    inv = make_inventory("n0", POOL, gpus=2, labels={"gpu.model": model, "nvlink.cliques": "1"})
    inv = msgspec.structs.replace(inv, labels=inv.labels)
    return AgentState(inv, NodeHealth(status=health), (), 0.0)  # type: ignore[arg-type]


def whole_node(tenant: str, start: int = NOW - 1000, end: int = NOW + 3_600_000) -> NodeBookings:
    node = BookedDevice(atom_id="n0:node", cls="node")
    gpu = BookedDevice(atom_id="n0:gpu:G", cls="gpu", device_id="G")
    booking = NodeBooking(reservation_id="rsv_1", tenant_id=tenant, state="active", start=start,
                          end=end, devices=(node, gpu))  # fmt: skip
    part = NodeBooking(reservation_id="rsv_2", tenant_id="other", state="active", start=start,
                       end=end, devices=(gpu,))  # fmt: skip
    return NodeBookings(node_id="n0", etag="e", sent_at=NOW, bookings=(part, booking))


def test_the_file_has_pool_model_cliques_health_and_the_whole_node_tenant() -> None:
    text = render(features(state(), whole_node("acme:team-1"), NOW), NOW + 300_000)
    labels = nfd_parse(text, datetime.fromtimestamp(NOW / 1000).astimezone())
    assert labels == {
        "gpufleet.io/pool": POOL,
        "gpufleet.io/gpu-model": "NVIDIA-H100-80GB-HBM3",
        "gpufleet.io/gpu-count": "2",
        "gpufleet.io/nvlink-cliques": "1",
        "gpufleet.io/health": "healthy",
        "gpufleet.io/tenant": "acme-team-1",  # ':' is not allowed in a label value
    }
    # Past its expiry NFD takes nothing from it: a dead agent's labels go away.
    later = datetime.fromtimestamp((NOW + 400_000) / 1000).astimezone()
    assert nfd_parse(text, later) == {}


def test_only_a_live_whole_node_booking_names_a_tenant() -> None:
    assert "gpufleet.io/tenant" not in features(state(), None, NOW)
    future = whole_node("acme", start=NOW + 1000)
    assert "gpufleet.io/tenant" not in features(state(), future, NOW)
    ended = whole_node("acme", end=NOW)
    assert "gpufleet.io/tenant" not in features(state(), ended, NOW)


@given(st.text(max_size=300), st.text(max_size=200), st.sampled_from(["healthy", "unhealthy"]))
def test_any_model_or_tenant_text_gives_valid_labels(model: str, tenant: str, health: str) -> None:
    labels = features(state(model, health), whole_node(tenant), NOW)
    text = render(labels, NOW + 60_000)
    assert nfd_parse(text, datetime.fromtimestamp(NOW / 1000).astimezone()) == labels
    assert len(label_value(tenant)) <= 63


def test_the_file_is_replaced_atomically_and_rewritten_before_it_expires(tmp_path: Path) -> None:
    file = FeatureFile(tmp_path, interval_s=5.0)
    file.on_state(state(), NOW)
    assert os.listdir(tmp_path) == ["gpufleet"]  # the dot-file it was written as is gone
    first = (tmp_path / "gpufleet").read_text()
    assert "gpufleet.io/health=healthy" in first and len(first.encode()) < MAX_BYTES
    file.on_state(state(), NOW + 1000)
    assert file.writes == 1  # nothing changed, far from expiry
    file.on_bookings(whole_node("acme"), NOW + 2000)
    assert file.writes == 2 and "gpufleet.io/tenant=acme" in (tmp_path / "gpufleet").read_text()
    file.on_state(state(), NOW + file.expiry_ms // 2 + 2000)
    assert file.writes == 3  # half way to expiry: rewritten with a later one
    file.on_state(state(health="unhealthy"), NOW + file.expiry_ms // 2 + 3000)
    assert "gpufleet.io/health=unhealthy" in (tmp_path / "gpufleet").read_text()
