"""The XID severity table: which NVIDIA XID error codes are device faults.

Not every XID means a broken GPU. Application errors (13 graphics engine exception,
31 MMU fault, 43 channel stopped, 45 preemptive cleanup, 68 video processor exception)
come from user code and leave the device usable. The faults below need a reset, a
reboot or an RMA. Both lists are configurable: `xid_faults` adds codes to the fault
list, `xid_ignore` removes them. Codes in neither list are logged, not acted on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68})

DEFAULT_FAULT_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

XidClass = Literal["fault", "application", "other"]


@dataclass(frozen=True)
class XidTable:
    faults: frozenset[int] = frozenset(DEFAULT_FAULT_XIDS)

    @classmethod
    def configured(cls, add: tuple[int, ...] = (), ignore: tuple[int, ...] = ()) -> XidTable:
        return cls(faults=(frozenset(DEFAULT_FAULT_XIDS) | set(add)) - set(ignore))

    def classify(self, xid: int) -> XidClass:
        if xid in self.faults:
            return "fault"
        if xid in APPLICATION_XIDS:
            return "application"
        return "other"

    def describe(self, xid: int) -> str:
        text = DEFAULT_FAULT_XIDS.get(xid)
        return f"xid {xid} ({text})" if text else f"xid {xid}"
