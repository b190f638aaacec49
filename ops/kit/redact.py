"""Secrets out of log lines: the user:password of a URL and the values of its query
(webhook URLs carry tokens there), wherever they appear in a message or an exception."""

from __future__ import annotations

import logging
import re

# scheme://user:password@host -> scheme://***@host
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#@\s]+@")
# ?token=abc&x=1 -> ?token=***&x=***; every value, since which ones are secret is the
# receiver's business.
_QUERY_VALUE = re.compile(r"(?P<key>[?&;][^=&;#\s'\"]+=)[^&;#\s'\">]*")


def redact(text: str) -> str:
    """`text` with every URL's userinfo and query values replaced by `***`."""
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _QUERY_VALUE.sub(r"\g<key>***", text)


class RedactingFilter(logging.Filter):
    """Rewrites a record's message and exception text through `redact` before any
    handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


# The one logger of the forwarder; every part logs through it, so the filter sees all.
log = logging.getLogger("gpufleet.alerts")
log.addFilter(RedactingFilter())
