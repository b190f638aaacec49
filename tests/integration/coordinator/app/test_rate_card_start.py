"""The coordinator refuses to start on a rate card that prices a GPU model none of its
pools has (issue 35 point 8: an unknown model, named with file, line and field), and
starts on one whose models the fleet has."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.app import running_coordinator
from coordinator.ledger import Ledger
from procs.settings import ConfigError
from shared.clock import FakeClock
from tests.integration.conftest import coordinator_settings

CARD = """currency = "EUR"
[[rate]]
resource = "gpu"
model = "H100"
reserved = "2"
on_demand = "3"
effective_from = 2026-12-01
"""


async def test_an_unknown_model_stops_the_start_and_a_known_one_does_not(
    database_url: str, nats_url: str, tmp_path: Path
) -> None:
    card = tmp_path / "rates.toml"
    card.write_text(CARD)
    settings = coordinator_settings(database_url, nats_url, rate_card=str(card))
    with pytest.raises(ConfigError) as err:
        async with running_coordinator(settings, FakeClock(1_800_000_000_000)):
            pass
    assert f"rate_card: {card}:4: rate[0].model: unknown GPU model 'H100'" in str(err.value)
    ledger = await Ledger.open(database_url)
    try:
        await ledger.tenants.create("acme", "Acme", 0)
        await ledger.pools.create("pool_01m8sh47wk7chbrd97d0p86m88", "a", "acme", "H100", 0)
    finally:
        await ledger.close()
    async with running_coordinator(settings, FakeClock(1_800_000_000_000)) as c:
        assert c.ledger is not None
