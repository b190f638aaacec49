"""The NATS server list an agent or a coordinator is given: one URL or a comma-separated
list of seeds (`nats://a:4222,nats://b:4222`). nats-py tries the seeds in turn and then
learns the rest of the cluster from the server it reached, so one live seed is enough
to start. Pure: no I/O."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

SCHEMES = ("nats", "tls", "ws", "wss")
_URL = re.compile(r"^(nats|tls|ws|wss)://[^\s/,]+/?$")


def split_servers(value: str) -> list[str]:
    """The seeds of a `nats_url` setting, in the order given; ValueError names the first
    one that is not a `nats://host:port` URL."""
    servers = [part.strip() for part in value.split(",")]
    if not any(servers):
        raise ValueError("no NATS server URL given")
    for url in servers:
        if not _URL.match(url):
            raise ValueError(f"{url!r} is not a nats://host:port URL")
        parts = urlsplit(url)
        try:
            port = parts.port  # urllib refuses a port that is not 0..65535
        except ValueError:
            raise ValueError(f"{url!r} has no valid port") from None
        if not parts.hostname or port == 0:
            raise ValueError(f"{url!r} needs a host and a port other than 0")
    return servers
