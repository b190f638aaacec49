"""API keys as the coordinator accepts them (`gpf_<16 Crockford>_<secret>`), made here
for `gpufleet new-key` and the demo's bootstrap operator key."""

from __future__ import annotations

import secrets

from shared.ids import CROCKFORD


def new_key() -> str:
    key_id = "".join(secrets.choice(CROCKFORD) for _ in range(16))
    return f"gpf_{key_id}_{secrets.token_urlsafe(32)}"
