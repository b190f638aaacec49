"""The common heartbeat, decoded fast: a msgspec mirror of `shared.wire.Heartbeat` for
the shape nearly every heartbeat has, and nothing else.

Ingest takes tens of thousands of heartbeats a second, and the pydantic model's
validation (regex constraints on five strings, a nested model) was about a third of
the coordinator's cost per heartbeat (bench/ingest_bench.py). Most heartbeats say the
same thing each time: this node, this boot, its status, no device to report. `Beat`
accepts exactly that shape, with the wire's names and every bound the model has,
through a decoder compiled once; it answers None for anything else — a device list, a
NUL escape, a lenient form the model would coerce (`"5"` for 5, `true` spelled as a
string, snake_case names), an error of any kind — and ingest then asks the model,
which stays the one authority on what a heartbeat is and why one is refused.

The contract, checked by tests/unit/test_beat.py over generated payloads: whatever
`decode` accepts, the model accepts too, with the same values. The id patterns are not
matched per message: the payload's ids must equal the subject's, which the caller has
matched against the patterns once per subject.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from shared.wire import SCHEMA_VERSION, HealthStatus

__all__ = ["Beat", "BeatHealth", "decode"]

# The model's bounds (shared/wire.py): lengths of the ledger's columns, ranges of its
# integers. Patterns are not repeated here: NUL is refused below for the whole payload,
# and the ids are compared with the subject's.
_Text64 = Annotated[str, Meta(max_length=64)]
_Text128 = Annotated[str, Meta(max_length=128)]
_Reason = Annotated[str, Meta(max_length=1024)]
_Int63 = Annotated[int, Meta(ge=0, le=2**63 - 1)]
_Int32 = Annotated[int, Meta(ge=0, le=2**31 - 1)]
_NodeId = Annotated[str, Meta(max_length=128)]
_PoolId = Annotated[str, Meta(max_length=57)]

_NUL = b"\\u0000"  # the only way a NUL reaches a JSON string (a raw one is malformed)


# gc=False: values of strings and numbers only, never in a cycle; tens of thousands a
# second need not be walked by the cyclic GC (msgspec's own advice for such structs).
class BeatHealth(Struct, frozen=True, rename="camel", gc=False):
    status: HealthStatus
    reasons: Annotated[tuple[_Reason, ...], Meta(max_length=64)] = ()


class Beat(Struct, frozen=True, rename="camel", gc=False):
    """A heartbeat with no device to report; read like `Heartbeat` (same names: it is a
    `coordinator.domain.liveness.HeartbeatFacts`, and `as_heartbeat` makes the model)."""

    node_id: _NodeId
    pool_id: _PoolId
    boot_id: _Text64
    seq: _Int63
    sent_at: _Int63
    interval_ms: Annotated[int, Meta(ge=100, le=3_600_000)]
    inventory_hash: _Text128
    health: BeatHealth
    schema_version: _Int32 = SCHEMA_VERSION
    provisioning: bool = False
    devices: tuple[()] = ()
    bus_errors: _Int63 = 0


_DECODER = msgspec.json.Decoder(Beat)


def decode(data: bytes, pool_id: str, node_id: str) -> Beat | None:
    """The heartbeat in `data` when it has the common shape, keeps every bound and names
    `pool_id`/`node_id` (the subject's, well formed); None when the model has to decide
    (never raises)."""
    if _NUL in data:
        return None
    try:
        value = _DECODER.decode(data)
    except msgspec.MsgspecError:
        return None
    if value.node_id != node_id or value.pool_id != pool_id:
        return None
    return value
