"""The XID severity table: what each NVIDIA XID error code means for the device.

Classes follow NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid
Errors with the Xid Catalog", Resolution Bucket columns):

- `reset` — the catalogue's immediate action is RESET_GPU, RESTART_BM or a workflow that
  ends in a reset (48, 74, NVLink5 144-150): the device is unhealthy until a reset is seen
  (the GPU disappears and reappears, or NVML's recovery action field reads NONE), never on
  a timer;
- `reset_degraded` — 94, a contained ECC error: the application restarts and "other
  applications are unaffected … reset the GPU when convenient", so the device is degraded
  (still bookable) until that reset;
- `recovery` — 154 (GPU_RECOVERY_ACTION_CHANGED) summarises the action other XIDs need:
  the device is held until the recovery action field reads NONE or a reset is seen;
- `fault` — unhealthy for `xid_hold_s` after the last event (codes an operator adds);
- `application` — user code errors that leave the device usable (13, 31, 43, 45, 68);
- `informational` — corrected or unused codes the catalogue says to ignore (63, 92, 121,
  123): logged, not acted on.

Both lists are configurable: `xid_faults` adds codes as timer-held faults, `xid_ignore`
removes any code from every acting class. Codes in no list are `other`: logged only.
"""

from __future__ import annotations

from typing import Literal

import msgspec

XidClass = Literal[
    "reset", "reset_degraded", "recovery", "fault", "application", "informational", "other"
]

APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68})

# The catalogue's mnemonic or description, and the class it implies.
CATALOGUE: dict[int, tuple[XidClass, str]] = {
    13: ("application", "graphics engine exception"),
    31: ("application", "GPU memory page fault"),
    43: ("application", "GPU stopped processing (application)"),
    45: ("application", "preemptive cleanup"),
    46: ("reset", "GPU stopped processing"),
    48: ("reset", "double-bit ECC error"),
    62: ("reset", "internal micro-controller halt"),
    63: ("informational", "row remapping event (succeeded)"),
    64: ("reset", "row remapping / page retirement failure"),
    68: ("application", "video processor exception"),
    74: ("reset", "NVLink error"),
    79: ("reset", "GPU has fallen off the bus"),
    92: ("informational", "high single-bit ECC error rate"),
    94: ("reset_degraded", "contained ECC error (reset when convenient)"),
    95: ("reset", "uncontained ECC error"),
    109: ("reset", "context switch timeout"),
    119: ("reset", "GSP RPC timeout"),
    120: ("reset", "GSP error"),
    121: ("informational", "C2C link corrected error"),
    123: ("informational", "SPI PMU RPC write failure (unused on A100/H100/B100/GB200)"),
    136: ("reset", "NVLink training failed"),
    140: ("reset", "unrecovered ECC error"),
    143: ("reset", "GPU initialization error"),
    144: ("reset", "NVLink SAW error"),
    145: ("reset", "NVLink RLW error"),
    146: ("reset", "NVLink TLW error"),
    147: ("reset", "NVLink TREX error"),
    148: ("reset", "NVLink NVLPW_CTRL error"),
    149: ("reset", "NVLink NETIR error"),
    150: ("reset", "NVLink MSE error"),
    154: ("recovery", "GPU recovery action changed"),
    155: ("reset", "NVLink SW-defined error (link down)"),
}

# Kept for callers that want the acting set by its old name.
DEFAULT_FAULT_XIDS: dict[int, str] = {
    x: text for x, (cls, text) in CATALOGUE.items() if cls in ("reset", "reset_degraded")
}


class XidTable(msgspec.Struct, frozen=True):
    added: frozenset[int] = frozenset()
    ignored: frozenset[int] = frozenset()

    @classmethod
    def configured(cls, add: tuple[int, ...] = (), ignore: tuple[int, ...] = ()) -> XidTable:
        return cls(added=frozenset(add), ignored=frozenset(ignore))

    def classify(self, xid: int) -> XidClass:
        if xid in self.ignored:
            return "informational"
        known = CATALOGUE.get(xid)
        if known is not None and known[0] not in ("application", "informational"):
            return known[0]
        if xid in self.added:
            return "fault"
        if known is not None:
            return known[0]
        return "other"

    def describe(self, xid: int) -> str:
        known = CATALOGUE.get(xid)
        return f"xid {xid} ({known[1]})" if known else f"xid {xid}"
