"""The alert forwarder's logger, every line of it through `procs.redact` (its targets'
URLs carry tokens and passwords)."""

from __future__ import annotations

import logging

from procs.redact import RedactingFilter, redact

__all__ = ["log", "redact"]

# The one logger of the forwarder; every part logs through it, so the filter sees all.
log = logging.getLogger("gpufleet.alerts")
log.addFilter(RedactingFilter())
