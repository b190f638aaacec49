"""A Node Feature Discovery feature file (`<nfd_features_dir>/gpufleet`) for Kubernetes:
nfd-worker's `local` source turns its lines into node labels.

The format is NFD's for the `local` source: one `<namespace>/<name>=<value>` a line,
`#` comments, a `# +expiry-time=<RFC 3339>` directive after which NFD ignores what
follows, at most 64 KiB; the file is written under a dot-name (NFD skips dot files)
and renamed over the old one. Names and values follow Kubernetes' label rules: a name
of at most 63 characters, alphanumeric at both ends with `-`, `_`, `.` between; a value
the same or empty. Text from elsewhere (a GPU model, a tenant id) is made to fit by
replacing what is not allowed with `-` and cutting it to 63 characters.

The labels: the pool, the GPU model, the NVLink cliques (their count, and the clique
when one holds every GPU), the fabric clique, the node's health, and the tenant of the
whole-node booking active now (none when there is none). The expiry is a few polls
ahead and the file is rewritten before it comes, so a dead agent's labels go away on
their own rather than telling the scheduler a stale story.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from pathlib import Path

from agent.bookings import write_atomically
from agent.state import AgentState
from procs.log_throttle import LogThrottle
from shared.wire import NodeBookings

log = logging.getLogger(__name__)

FILE_NAME = "gpufleet"
NAMESPACE = "gpufleet.io"
MAX_BYTES = 64 * 1024
MIN_EXPIRY_S = 300.0
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_.-]+")
_ENDS = "-_."


def label_value(text: str) -> str:
    """`text` as a Kubernetes label value (possibly empty)."""
    return _NOT_ALLOWED.sub("-", text)[:63].strip(_ENDS)


def whole_node_tenant(bookings: NodeBookings | None, now_ms: int) -> str | None:
    """The tenant whose booking holds the whole node at `now_ms`, if any."""
    for b in bookings.bookings if bookings is not None else ():
        live = b.state in ("active", "noticed") and b.start <= now_ms < b.end
        if live and any(d.cls == "node" for d in b.devices):
            return b.tenant_id
    return None


def features(state: AgentState, bookings: NodeBookings | None, now_ms: int) -> dict[str, str]:
    inv = state.inventory
    found = {
        "pool": inv.pool_id,
        "gpu-model": inv.labels.get("gpu.model", ""),
        "gpu-count": str(len(inv.gpus)),
        "nvlink-cliques": inv.labels.get("nvlink.cliques", "0"),
        "fabric-clique": inv.labels.get("nvlink.fabric", ""),
        "health": state.health.status,
        "tenant": whole_node_tenant(bookings, now_ms) or "",
    }
    cliques = {g.nvlink_clique for g in inv.gpus}
    if inv.gpus and len(cliques) == 1:
        found["nvlink-clique"] = cliques.pop() or ""
    out = {f"{NAMESPACE}/{name}": label_value(value) for name, value in found.items()}
    return {name: value for name, value in sorted(out.items()) if value}


def render(labels: dict[str, str], expires_ms: int) -> str:
    expiry = datetime.fromtimestamp(expires_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [
        "# Written by gpufleet-agent; rewritten before it expires.",
        f"# +expiry-time={expiry}",
        *(f"{name}={value}" for name, value in labels.items()),
    ]
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > MAX_BYTES:  # NFD ignores a larger file whole
        raise ValueError(f"feature file of {len(text.encode())} bytes exceeds {MAX_BYTES}")
    return text


class FeatureFile:
    """Keeps `<directory>/gpufleet` current: rewritten when a label changes or half of
    its time to expiry has passed."""

    def __init__(self, directory: Path, interval_s: float) -> None:
        self.path = directory / FILE_NAME
        self.expiry_ms = int(max(MIN_EXPIRY_S, 10 * interval_s) * 1000)
        self._written: dict[str, str] | None = None
        self._rewrite_at = 0
        self._state: AgentState | None = None
        self._bookings: NodeBookings | None = None
        self.writes = 0
        self.failures = 0
        self._throttle = LogThrottle(log)

    def on_state(self, state: AgentState, now_ms: int) -> None:
        self._state = state
        self._refresh(now_ms)

    def on_bookings(self, bookings: NodeBookings, now_ms: int) -> None:
        self._bookings = bookings
        self._refresh(now_ms)

    def _refresh(self, now_ms: int) -> None:
        if self._state is None:
            return
        labels = features(self._state, self._bookings, now_ms)
        if labels == self._written and now_ms < self._rewrite_at:
            return
        try:
            text = render(labels, now_ms + self.expiry_ms)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, text.encode(), 0o644)
        except (OSError, ValueError) as exc:
            self.failures += 1
            self._throttle.warning("write", "cannot write %s: %s", self.path, exc)
            return
        self._written = labels
        self._rewrite_at = now_ms + self.expiry_ms // 2
        self.writes += 1
