"""The servers a client may connect to: the seeds it was given, shuffled once as nats-py
shuffles them, and the rest of the cluster as the servers' INFO announces it
(`connect_urls`). Which one the next attempt goes to is a `Chooser`'s call, given the
pool and the last INFO, the hook nats-py calls `reconnect_to_server_handler` (the
agent's `ServerRotation` is one); `RoundRobin` is the default: each server in turn, a
wait after each full round."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, urlsplit

import msgspec

DEFAULT_PORT = 4222


class Server(msgspec.Struct, frozen=True):
    """One server of the pool; `uri` is urllib's, as nats-py's servers have it."""

    uri: SplitResult
    discovered: bool = False

    @property
    def host(self) -> str:
        return self.uri.hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        return self.uri.port or DEFAULT_PORT

    @property
    def tls(self) -> bool:
        """Whether the URL itself asks for TLS (`tls://`)."""
        return self.uri.scheme == "tls"


# Which server the next attempt goes to, and after how many seconds.
Chooser = Callable[[list[Server], dict[str, Any]], tuple[Server, float]]


def parse_server(url: str) -> Server:
    if "://" not in url:
        url = f"nats://{url}"
    return Server(urlsplit(url))


class ServerPool:
    def __init__(self, urls: list[str], *, randomize: bool = True) -> None:
        if not urls:
            raise ValueError("no NATS server URL given")
        self.servers = [parse_server(url) for url in urls]
        if randomize:
            random.shuffle(self.servers)

    def _known(self, host: str, port: int) -> bool:
        return any(s.host == host and s.port == port for s in self.servers)

    def learn(self, info: dict[str, Any], tls: bool) -> None:
        """Add the servers an INFO announces (`connect_urls`, host:port each) that the
        pool does not hold yet; with the scheme the link uses."""
        urls = info.get("connect_urls")
        if not isinstance(urls, list):
            return
        scheme = "tls" if tls else "nats"
        for url in urls:
            if not isinstance(url, str):
                continue
            server = Server(urlsplit(f"{scheme}://{url}"), discovered=True)
            try:
                host, port = server.host, server.port
            except ValueError:  # a port urllib refuses: not one to connect to
                continue
            if not self._known(host, port):
                self.servers.append(server)


class RoundRobin:
    """The default chooser: every server once in the pool's order, then `wait_s` before
    the next round."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._next = 0
        self._tried = 0

    def __call__(self, servers: list[Server], info: dict[str, Any]) -> tuple[Server, float]:
        delay = 0.0
        if self._tried >= len(servers):
            self._tried = 0
            delay = self.wait_s
        server = servers[self._next % len(servers)]
        self._next += 1
        self._tried += 1
        return server, delay
