"""The rate card (SPEC §13, issue 35), pure: reserved and on-demand unit prices per
resource and GPU model, in one currency, each effective from a date, earlier prices kept
as history; and costs of quantities, in `Decimal`, never float.

The file is TOML:

    currency = "EUR"
    minor_units = 2            # integer prices are in minor units (cents)

    [[rate]]
    resource = "memory_gb"     # memory_gb (per GB-hour) or gpu (per GPU-hour)
    model = "*"                # a GPU model, or "*" for any the card names no price for
    reserved = "0.0100"        # a decimal string, or an integer in minor units
    on_demand = "0.0150"
    effective_from = 2026-12-01

A float price (`0.01`) is refused: TOML floats are binary and a bill is not. Any
problem is refused as a whole, naming the file, the line and the field.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation

from coordinator.domain.toml_lines import parsed, table_line, top_line

RESOURCES = {"memory_gb": "GB-hour", "gpu": "GPU-hour"}
ANY_MODEL = "*"
_CURRENCY = re.compile(r"^[A-Z]{3}$")
_DECIMAL = re.compile(r"^[0-9]+(\.[0-9]+)?$")
_FIELDS = {"resource", "model", "reserved", "on_demand", "effective_from"}


class RateCardError(ValueError):
    """A rate card that cannot be used; the message names file, line and field."""


@dataclass(frozen=True, slots=True)
class Rate:
    resource: str
    model: str
    reserved: Decimal  # per unit (GB-hour, GPU-hour)
    on_demand: Decimal
    effective_from: int  # ms since the epoch, UTC midnight
    line: int = 0  # the line of its `model`, for errors found after parsing
    index: int = 0  # its place in the file: rate[index]


@dataclass(frozen=True, slots=True)
class RateCard:
    currency: str
    rates: tuple[Rate, ...]  # by resource, model, effective_from

    def rate(self, resource: str, model: str, at: int) -> Rate | None:
        """The price of `resource` on `model` at `at`: the model's own, else `*`'s; the
        latest effective at or before `at`."""
        for wanted in (model, ANY_MODEL):
            found = [
                r
                for r in self.rates
                if r.resource == resource and r.model == wanted and r.effective_from <= at
            ]
            if found:
                return max(found, key=lambda r: r.effective_from)
        return None

    def unit(self, resource: str) -> str:
        return RESOURCES[resource]


def cost(quantity: Decimal, price: Decimal) -> Decimal:
    """A cost to the cent's tenth of a thousandth: the export rounds only its sums."""
    return quantity * price


def _line_of(lines: Sequence[str], index: int, key: str | None) -> int:
    return table_line(lines, "rate", index, key)


def _price(value: object, minor_units: int, where: str) -> Decimal:
    if isinstance(value, float):
        raise RateCardError(
            f"{where}: a float price is refused (binary floats are not money); write it as "
            'a string ("0.01") or an integer in minor units'
        )
    if isinstance(value, bool):
        raise RateCardError(f"{where}: must be a decimal string or an integer in minor units")
    if isinstance(value, int):
        if value < 0:
            raise RateCardError(f"{where}: must not be negative")
        return Decimal(value).scaleb(-minor_units)
    if isinstance(value, str) and _DECIMAL.match(value):
        try:
            return Decimal(value)
        except InvalidOperation:
            pass
    raise RateCardError(f'{where}: must be a decimal string like "0.0125" or an integer')


def _day(value: object, where: str) -> int:
    if isinstance(value, datetime):
        raise RateCardError(f"{where}: a date (2026-12-01), not a time")
    if isinstance(value, str):
        try:
            value = date.fromisoformat(value)
        except ValueError:
            raise RateCardError(f"{where}: must be a date like 2026-12-01") from None
    if not isinstance(value, date):
        raise RateCardError(f"{where}: must be a date like 2026-12-01")
    return int(datetime(value.year, value.month, value.day, tzinfo=UTC).timestamp() * 1000)


def parse_rate_card(text: str, path: str) -> RateCard:
    """The card in `text` (read from `path`, named in errors), or RateCardError."""
    lines = text.splitlines()
    doc = parsed(text, path, RateCardError)
    unknown = sorted(set(doc) - {"currency", "minor_units", "rate"})
    if unknown:
        key = unknown[0]
        raise RateCardError(f"{path}:{top_line(lines, key)}: {key}: not a rate card field")
    currency = doc.get("currency")
    if not isinstance(currency, str) or not _CURRENCY.match(currency):
        line = top_line(lines, "currency")
        raise RateCardError(f'{path}:{line}: currency: an ISO 4217 code like "EUR"')
    minor = doc.get("minor_units", 2)
    if isinstance(minor, bool) or not isinstance(minor, int) or not 0 <= minor <= 6:
        line = top_line(lines, "minor_units")
        raise RateCardError(f"{path}:{line}: minor_units: an integer from 0 to 6")
    entries = doc.get("rate", [])
    if not isinstance(entries, list):
        raise RateCardError(f"{path}:{top_line(lines, 'rate')}: rate: must be [[rate]] tables")
    rates: list[Rate] = []
    seen: dict[tuple[str, str, int], int] = {}
    for i, entry in enumerate(entries):

        def where(key: str | None, i: int = i) -> str:
            field = f"rate[{i}]" + (f".{key}" if key else "")
            return f"{path}:{_line_of(lines, i, key)}: {field}"

        if not isinstance(entry, dict):
            raise RateCardError(f"{where(None)}: must be a table")
        extra = sorted(set(entry) - _FIELDS)
        if extra:
            raise RateCardError(f"{where(extra[0])}: not a rate field")
        for missing in sorted(_FIELDS - set(entry)):
            raise RateCardError(f"{where(None)}.{missing}: required")
        resource, model = entry["resource"], entry["model"]
        if resource not in RESOURCES:
            raise RateCardError(
                f"{where('resource')}: unknown resource {resource!r} "
                f"(one of {', '.join(sorted(RESOURCES))})"
            )
        if not isinstance(model, str) or not 0 < len(model) <= 64:
            raise RateCardError(f'{where("model")}: a GPU model name, or "*"')
        if resource == "memory_gb" and model != ANY_MODEL:
            raise RateCardError(f'{where("model")}: memory_gb is priced for model "*" only')
        reserved = _price(entry["reserved"], minor, where("reserved"))
        on_demand = _price(entry["on_demand"], minor, where("on_demand"))
        start = _day(entry["effective_from"], where("effective_from"))
        when = (resource, model, start)
        if when in seen:
            raise RateCardError(
                f"{where('effective_from')}: overlaps rate[{seen[when]}] "
                f"(same resource, model and effective date)"
            )
        seen[when] = i
        line = _line_of(lines, i, "model")
        rates.append(Rate(resource, model, reserved, on_demand, start, line, i))
    rates.sort(key=lambda r: (r.resource, r.model, r.effective_from))
    return RateCard(currency, tuple(rates))


def check_models(card: RateCard, path: str, known: set[str]) -> None:
    """Refuse a card that prices a GPU model no pool of the fleet has (a typo would
    otherwise bill that model's GPUs at the `*` price, silently)."""
    for rate in sorted(card.rates, key=lambda r: r.index):
        if rate.model != ANY_MODEL and rate.model not in known:
            shown = ", ".join(sorted(known)) or "none yet"
            raise RateCardError(
                f"{path}:{rate.line}: rate[{rate.index}].model: unknown GPU model {rate.model!r} "
                f"(the fleet's pools have: {shown})"
            )
