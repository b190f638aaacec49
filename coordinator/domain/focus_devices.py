"""The FOCUS export's device rows (SPEC §13, issue 35), pure: per hour and device
reservation, its booked unit-hours used and unused; per hour, tenant and pool, GPU use
no booking covered, on demand.

Prices come from the rate card's `gpu` rate of the pool's GPU model. A whole GPU
(`gpu`) is one GPU-hour at that price; a MIG instance (`gpu.mig`) and a time-slice or
MPS slot (`gpu.slot`) are priced by the fraction of the GPU they are (`gpu_share`):
a MIG profile `Ng.*` is N of the GPU's 7 compute slices, a slot is one of the GPU's
`replicas`. A reservation's rows use the mean share of its atoms of that class (they
share the reservation's booked time). Other classes (nodes, VFs, disks) are quantities
only (cost 0): the card has no rate for them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction

from coordinator.domain.consumption import HOUR_MS
from coordinator.domain.focus import (
    Cells,
    Charge,
    Parts,
    Place,
    fixed,
    head_of,
    periods,
    prices,
    row,
    tags,
)
from coordinator.domain.rate_card import RateCard

# Booked classes of device reservations: their FOCUS unit.
DEVICE_UNITS = {"gpu": "GPU-Hours", "gpu.mig": "MIG-Hours", "gpu.slot": "Slot-Hours",
                "node": "Node-Hours"}  # fmt: skip
PRICED = frozenset({"gpu", "gpu.mig", "gpu.slot"})  # at the card's gpu rate, by share
MIG_SLICES = 7  # compute slices of a MIG-capable GPU (A100, H100, H200, B200)
_MIG_PROFILE = re.compile(r"^(\d+)g\.")
WHOLE = (1, 1)
NOWHERE = Place()


def gpu_share(cls: str, attrs: Mapping[str, object]) -> Fraction:
    """The fraction of a GPU one atom of `cls` is (1 for a whole GPU)."""
    if cls == "gpu.mig":
        m = _MIG_PROFILE.match(str(attrs.get("profile", "")))
        return Fraction(min(int(m.group(1)), MIG_SLICES) if m else 1, MIG_SLICES)
    if cls == "gpu.slot":
        replicas = attrs.get("replicas")
        return Fraction(1, replicas if isinstance(replicas, int) and replicas > 0 else 1)
    return Fraction(1)


def mean_share(shares: Iterable[Fraction]) -> tuple[int, int]:
    values = list(shares)
    if not values:
        return WHOLE
    mean = sum(values, Fraction(0)) / len(values)
    return mean.numerator, mean.denominator


@dataclass(frozen=True, slots=True)
class DeviceHour:
    """One hour of one device reservation and booked class (or, `reservation_id` "",
    of a tenant's use in a pool no booking covered): unit-ms booked, used and idle."""

    hour: int
    reservation_id: str
    tenant_id: str | None  # None: unattributed
    pool_id: str
    gpu_model: str
    resource: str
    booked_ms: int
    used_ms: int
    idle_ms: int
    length_ms: int = HOUR_MS  # less where the window cuts the hour
    project_id: str | None = None
    share: tuple[int, int] = WHOLE  # of a GPU, per unit (`gpu_share`)
    place: Place = NOWHERE


_WHAT = {
    "Used": "Booked GPU time, used",
    "Unused": "Booked GPU time, not used (or idle)",
    "": "GPU time used with no booking (on demand)",
}


def device_rows(hours: Iterable[DeviceHour], card: RateCard | None) -> Iterator[Cells]:
    """Per hour and reservation: booked unit-hours used (a process above the idle
    threshold) and unused (idle included), at the reserved price; unbooked GPU use at
    the on-demand price; GPU classes priced by their share of a GPU."""
    head = head_of(card)
    price = prices(card, "gpu")
    zero = ((0, 1), (0, 1))
    parts_of: dict[tuple[str, str, str, str, str | None, str], Parts] = {}
    for h in hours:
        (rn, rd), (on, od) = price(h.gpu_model, h.hour) if h.resource in PRICED else zero
        sn, sd = h.share
        if h.reservation_id == "":
            items = [("", h.used_ms, on, od)]
        else:
            busy = h.used_ms - h.idle_ms
            items = [("Used", busy, rn, rd), ("Unused", h.booked_ms - busy, rn, rd)]
        for status, amount, pn, pd in items:
            if amount <= 0:
                continue
            key = (status, h.reservation_id, h.pool_id, h.resource, h.tenant_id, h.gpu_model)
            parts = parts_of.get(key)
            if parts is None:
                parts = parts_of[key] = Charge(
                    status, h.tenant_id, h.pool_id, "GPU", f"{h.resource}:{h.gpu_model or 'any'}",
                    DEVICE_UNITS.get(h.resource, "Hours"), h.reservation_id, _WHAT[status],
                    h.place, tags(h.pool_id, h.project_id),
                ).parts()  # fmt: skip
            yield row(
                head, periods(h.hour, h.length_ms), parts, fixed(amount, HOUR_MS),
                fixed(amount * pn * sn, HOUR_MS * pd * sd),
            )  # fmt: skip
