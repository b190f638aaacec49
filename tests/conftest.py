"""Fixtures shared by every test layer: a real nats-server per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coordinator.embedded_nats import EmbeddedNats


@pytest.fixture(scope="session")
def nats_server() -> Iterator[EmbeddedNats]:
    with EmbeddedNats() as server:
        yield server


@pytest.fixture
def nats_url(nats_server: EmbeddedNats) -> str:
    if not nats_server.running:
        nats_server.start()
    return nats_server.url
