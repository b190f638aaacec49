"""Secrets out of what a process logs or prints: the user:password of a URL and the
values of its query (webhook URLs carry tokens there), wherever they appear in a
message or an exception. One function for every process: a NATS URL may carry a
password (`nats://user:pass@host:4222`), and every daemon logs the one it was given
when that server cannot be reached; the alert forwarder logs its targets' URLs."""

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
