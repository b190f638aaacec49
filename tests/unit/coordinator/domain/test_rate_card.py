"""The rate card (SPEC §13, issue 35): decimal prices per resource and model with their
history; a card that does not parse, names an unknown resource, repeats an effective
date or uses a float price is refused at start with file, line and field."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from coordinator.config import CoordinatorSettings
from coordinator.domain.rate_card import RateCardError, check_models, parse_rate_card
from procs.settings import ConfigError, load

DAY = 86_400_000
DEC_1 = 1_796_083_200_000  # 2026-12-01T00:00:00Z

CARD = """\
currency = "EUR"
minor_units = 2

[[rate]]
resource = "memory_gb"
model = "*"
reserved = "0.0100"
on_demand = "0.0150"
effective_from = 2026-12-01

[[rate]]
resource = "memory_gb"
model = "*"
reserved = 2
on_demand = "0.03"
effective_from = 2027-01-01

[[rate]]
resource = "gpu"
model = "H100"
reserved = "2.10"
on_demand = "3.50"
effective_from = "2026-12-01"

[[rate]]
resource = "gpu"
model = "*"
reserved = "1"
on_demand = "1.5"
effective_from = 2026-12-01
"""


def test_prices_are_decimals_and_the_history_is_kept() -> None:
    card = parse_rate_card(CARD, "rates.toml")
    assert card.currency == "EUR"
    dec = card.rate("memory_gb", "*", DEC_1 + DAY)
    assert dec is not None and (dec.reserved, dec.on_demand) == (
        Decimal("0.0100"),
        Decimal("0.0150"),
    )
    jan = card.rate("memory_gb", "*", DEC_1 + 40 * DAY)
    assert jan is not None and jan.reserved == Decimal("0.02")  # 2 cents, minor units
    assert card.rate("memory_gb", "*", DEC_1 - 1) is None  # before any price: none
    h100 = card.rate("gpu", "H100", DEC_1)
    other = card.rate("gpu", "A100", DEC_1)
    assert h100 is not None and h100.reserved == Decimal("2.10")
    assert other is not None and other.reserved == Decimal("1")  # the "*" price


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (('reserved = "2.10"', "reserved = 2.10"),
         "rates.toml:21: rate[2].reserved: a float price"),
        (('resource = "gpu"\nmodel = "*"', 'resource = "tpu"\nmodel = "*"'),
         "rates.toml:26: rate[3].resource: unknown resource 'tpu'"),
        (("effective_from = 2027-01-01", "effective_from = 2026-12-01"),
         "rates.toml:16: rate[1].effective_from: overlaps rate[0]"),
        (('currency = "EUR"', 'currency = "euro"'), "rates.toml:1: currency"),
        (('on_demand = "0.03"', 'on_demand = "-1"'), "rates.toml:15: rate[1].on_demand"),
        (('model = "H100"', 'model = "H100"\nprice = 1'),
         "rates.toml:21: rate[2].price: not a rate field"),
        (("minor_units = 2", "minor_units = 2\n["), "rates.toml: does not parse"),
    ],
)  # fmt: skip
def test_a_bad_card_is_refused_naming_file_line_and_field(
    change: tuple[str, str], words: str
) -> None:
    text = CARD.replace(*change, 1)
    assert text != CARD
    with pytest.raises(RateCardError) as err:
        parse_rate_card(text, "rates.toml")
    assert str(err.value).startswith(words), str(err.value)


def test_the_coordinator_refuses_to_start_on_a_bad_card(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(CARD)
    bad.write_text(CARD.replace('reserved = "1"', "reserved = 1.0"))
    assert load(CoordinatorSettings, ["--rate-card", str(good)], {}).rate_card == str(good)
    with pytest.raises(ConfigError) as err:
        load(CoordinatorSettings, ["--rate-card", str(bad)], {})
    assert f"rate_card: {bad}:28: rate[3].reserved: a float price" in str(err.value)


def test_a_model_no_pool_has_is_refused_naming_its_line() -> None:
    card = parse_rate_card(CARD, "rates.toml")
    check_models(card, "rates.toml", {"H100", "A100"})
    with pytest.raises(RateCardError) as err:
        check_models(card, "rates.toml", {"A100"})
    assert str(err.value).startswith("rates.toml:20: rate[2].model: unknown GPU model 'H100'")
