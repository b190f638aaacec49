"""`LogThrottle` lives in `shared.log_throttle` (the agent uses it too); the coordinator's
modules import it from here."""

from __future__ import annotations

from shared.log_throttle import LogThrottle

__all__ = ["LogThrottle"]
