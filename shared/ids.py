"""Identifier formats: ULIDs in lowercase Crockford base32 and the prefixed ids built on them,
and the one form PCI addresses are compared in.

The patterns are the seed's (`pool_`/`prj_` + 26..52 chars of lowercase Crockford base32);
tenant and node ids are chosen by people and only validated here.
"""

from __future__ import annotations

import os
import time

CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"
# Every 10-bit value as its two characters, and where each pair sits in a ULID's 130 bits.
_PAIRS = [a + b for a in CROCKFORD for b in CROCKFORD]
_SHIFTS = range(120, -1, -10)

TENANT_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
NODE_ID_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
POOL_ID_PATTERN = r"^pool_[0-9a-hjkmnp-tv-z]{26,52}$"
PROJECT_ID_PATTERN = r"^prj_[0-9a-hjkmnp-tv-z]{26,52}$"
RESERVATION_ID_PATTERN = r"^rsv_[0-9a-hjkmnp-tv-z]{26,52}$"
IDEMPOTENCY_KEY_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"


def ulid(now_ms: int | None = None, randomness: bytes | None = None) -> str:
    """A 26-character ULID: 48-bit millisecond timestamp then 80 random bits."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    if not 0 <= ms < 1 << 48:
        raise ValueError("ULID timestamp out of range")
    rnd = os.urandom(10) if randomness is None else randomness
    if len(rnd) != 10:
        raise ValueError("ULID randomness must be 10 bytes")
    value = (ms << 80) | int.from_bytes(rnd, "big")
    # 26 characters of 5 bits, most significant first, looked up two at a time.
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])


def new_pool_id() -> str:
    return "pool_" + ulid()


def new_reservation_id() -> str:
    return "rsv_" + ulid()


def normalize_pci(bus_id: str) -> str:
    """One form for a PCI address: NVML writes `00000000:18:00.0`, sysfs `0000:18:00.0`."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            return text
    return text
