"""Prices: US dollars per hour of a device type (the catalog) or of a node (a cluster file).

    price = parse_price(fields.child("price"))   # catalog: {per_hour: 3.74, source: "...", date: 2021-03}
    price.per_hour                                # 3.74 (USD per GPU-hour)
    cluster.price_per_hour                        # the sum over nodes, or None where one is unknown

A price is optional everywhere: a plan without one simply prints no $/step. A node's
``price_per_hour`` in a cluster file overrides the sum of its devices' catalog prices, so owned
hardware can be priced at its amortised cost, or at zero.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from hetplan.contracts.fields import Fields

__all__ = ["MAX_PRICE_PER_HOUR", "Price", "parse_node_price", "parse_price"]

#: Above this many dollars per hour for one GPU or one node, a price is a typo (a cents/dollars mix-up,
#: a monthly figure): the largest cloud instances list at about $100/h for eight GPUs.
MAX_PRICE_PER_HOUR = 10_000.0

_DATE = re.compile(r"^\d{4}(-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?)?$")


@dataclass(frozen=True)
class Price:
    """A catalog price: USD per GPU-hour, where it was listed and when (prices move)."""

    per_hour: float
    source: str
    date: str


def _date(f: Fields, key: str) -> str:
    value = f.raw(key)
    if isinstance(value, datetime.date):  # YAML reads 2021-03-01 as a date
        return value.isoformat()
    if isinstance(value, int) and not isinstance(value, bool):  # a bare year
        value = str(value)
    if not isinstance(value, str) or not _DATE.match(value):
        raise f.error(f"expected a date YYYY, YYYY-MM or YYYY-MM-DD, got {value!r}", key)
    return value


def parse_price(f: Fields) -> Price:
    """``price: {per_hour: 3.74, source: "AWS p4d list price / 8", date: 2021-03}``: all three required."""
    per_hour = f.number("per_hour", minimum=0.0, maximum=MAX_PRICE_PER_HOUR)
    price = Price(per_hour=float(per_hour), source=f.str("source"), date=_date(f, "date"))
    f.done()
    return price


def parse_node_price(f: Fields) -> float | None:
    """A node's ``price_per_hour`` (USD for the whole node, >= 0); None when the node states none."""
    value = f.number("price_per_hour", None, minimum=0.0, maximum=MAX_PRICE_PER_HOUR)
    return None if value is None else float(value)
