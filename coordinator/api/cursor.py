"""Opaque, URL-safe pagination cursors (base64url of a small JSON value)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from coordinator.errors import InvalidInput


def encode_cursor(value: Any) -> str:
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, field: str = "cursor") -> Any:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise InvalidInput(
            "invalid cursor", {"fields": [{"path": field, "message": "not a cursor we issued"}]}
        ) from None
