"""Typed, located access to a parsed YAML mapping.

A :class:`Fields` wraps one mapping with the file it came from and its field path, so every check
that fails can say exactly where::

    f = Fields(data, file="c.yaml")
    name = f.str("name")
    for node in f.list("nodes"):           # each item is a Fields at "nodes[i]"
        bw = node.child("link").bandwidth("bandwidth")
    f.done()                               # unknown keys are typos: report them

Unknown keys are refused (with a "did you mean" hint) because a misspelt optional key would
otherwise be silently ignored and give a silently wrong plan.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Any, TypeVar

from hetplan import units
from hetplan.errors import HetplanError

__all__ = ["MISSING", "Fields"]

T = TypeVar("T")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


#: Integers in contract files are counts, sizes and indices; beyond 2**53 they are typos (and no
#: longer exact as floats), so they are refused rather than carried into arithmetic.
MAX_INTEGER = 2**53


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Fields):
        return "a mapping"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


class Fields:
    """One mapping of a contract file, with its place, read field by field."""

    def __init__(self, data: Any, *, file: str | None, path: str = "") -> None:
        self.file = file
        self.path = path
        if not isinstance(data, dict):
            raise self.error(f"expected a mapping, got {_type_name(data)}")
        self.data: dict[str, Any] = data
        self._used: set[str] = set()

    def __repr__(self) -> str:  # shown in messages when a mapping sits where a scalar belongs
        return repr(self.data)

    # -- places and errors -------------------------------------------------
    def where(self, key: str | int | None = None) -> str:
        """The field path of ``key`` inside this mapping."""
        if key is None:
            return self.path or "(top level)"
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        text = str(key)
        if not text.isprintable():  # a key with a newline or control character: keep the error one line
            text = repr(text)
        return f"{self.path}.{text}" if self.path else text

    def error(self, reason: str, key: str | int | None = None) -> HetplanError:
        return HetplanError(reason, file=self.file, field=self.where(key))

    # -- raw access ---------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = MISSING) -> Any:
        self._used.add(key)
        if key not in self.data:
            if default is MISSING:
                raise self.error(f"missing required field{self._typo_hint(key)}", key)
            return default
        return self.data[key]

    def _typo_hint(self, key: str) -> str:
        """``; found 'memroy' (a typo?)`` when a key present here looks like the missing ``key``."""
        present = [str(k) for k in self.data if k not in self._used]
        close = difflib.get_close_matches(key, present, n=1, cutoff=0.75)
        return f"; found {close[0]!r} (a typo?)" if close else ""

    def done(self, *, allow: tuple[str, ...] = ()) -> None:
        """Refuse keys that were never read: almost always a typo."""
        for key in self.data:
            if key in self._used or key in allow:
                continue
            hint = difflib.get_close_matches(str(key), sorted(self._used | set(allow)), n=1)
            suffix = f"; did you mean '{hint[0]}'?" if hint else ""
            known = ", ".join(sorted(self._used | set(allow)))
            raise self.error(f"unknown field (known here: {known}){suffix}", str(key))

    # -- typed access ---------------------------------------------------------
    def str(self, key: str, default: Any = MISSING, *, choices: tuple[str, ...] | None = None) -> Any:
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        if not isinstance(value, str) or not value.strip():
            raise self.error(f"expected a non-empty string, got {_type_name(value)} {value!r}", key)
        if choices is not None and value not in choices:
            raise self.error(f"expected one of {', '.join(choices)}, got {value!r}", key)
        return value

    def number(
        self,
        key: str,
        default: Any = MISSING,
        *,
        minimum: float | None = None,
        positive: bool = False,
        maximum: float | None = None,
    ) -> Any:
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        return self.check_number(value, key, minimum=minimum, positive=positive, maximum=maximum)

    def check_number(
        self,
        value: Any,
        key: str | int,
        *,
        minimum: float | None = None,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(f"expected a number, got {_type_name(value)} {value!r}", key)
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            number = math.inf
        if not math.isfinite(number):
            raise self.error(f"expected a finite number, got {value!r}", key)
        if positive and number <= 0:
            raise self.error(f"expected a positive number, got {value!r}", key)
        if minimum is not None and number < minimum:
            raise self.error(f"expected a number >= {minimum:g}, got {value!r}", key)
        if maximum is not None and number > maximum:
            raise self.error(f"expected a number <= {maximum:g}, got {value!r}", key)
        return number

    def integer(
        self, key: str, default: Any = MISSING, *, minimum: int | None = None, maximum: int | None = None
    ) -> Any:
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        return self.check_integer(value, key, minimum=minimum, maximum=maximum)

    def check_integer(
        self, value: Any, key: str | int, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        given = value
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self.error(f"expected an integer, got {_type_name(value)} {value!r}", key)
        if minimum is not None and value < minimum:
            raise self.error(f"expected an integer >= {minimum}, got {given!r}", key)
        limit = MAX_INTEGER if maximum is None else min(maximum, MAX_INTEGER)
        if value > limit:
            raise self.error(f"expected an integer <= {limit}, got {given!r}", key)
        if value < -MAX_INTEGER:
            raise self.error(f"expected an integer >= {-MAX_INTEGER}, got {given!r}", key)
        return int(value)

    def boolean(self, key: str, default: Any = MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        if not isinstance(value, bool):
            raise self.error(f"expected true or false, got {_type_name(value)} {value!r}", key)
        return value

    def _unit(self, key: str, default: Any, parse: Callable[[object], float], *, positive: bool) -> Any:
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        try:
            number = parse(value)
        except ValueError as exc:
            raise self.error(str(exc), key) from None
        if number < 0 or (positive and number == 0):
            raise self.error(f"expected a {'positive' if positive else 'non-negative'} value, got {value!r}", key)
        return number

    def bytes(self, key: str, default: Any = MISSING, *, positive: bool = True) -> Any:
        return self._unit(key, default, units.parse_bytes, positive=positive)

    def bandwidth(self, key: str, default: Any = MISSING) -> Any:
        return self._unit(key, default, units.parse_bandwidth, positive=True)

    def time(self, key: str, default: Any = MISSING) -> Any:
        return self._unit(key, default, units.parse_time, positive=False)

    # -- nesting ---------------------------------------------------------------
    def child(self, key: str, default: Any = MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        return Fields(value, file=self.file, path=self.where(key))

    def list(self, key: str, default: Any = MISSING, *, non_empty: bool = True) -> Any:
        """Items of a list field; mappings come back as :class:`Fields`, scalars as they are."""
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        if not isinstance(value, list):
            raise self.error(f"expected a list, got {_type_name(value)}", key)
        if non_empty and not value:
            raise self.error("expected a non-empty list", key)
        base = self.where(key)
        return [
            Fields(item, file=self.file, path=f"{base}[{i}]") if isinstance(item, dict) else item
            for i, item in enumerate(value)
        ]

    def mapping_items(self, key: str, default: Any = MISSING) -> Any:
        """``(name, value)`` pairs of a mapping field, in file order."""
        value = self.raw(key, default)
        if value is default and default is not MISSING:
            return value
        if not isinstance(value, dict):
            raise self.error(f"expected a mapping, got {_type_name(value)}", key)
        return list(value.items())

    def sub(self, key: str | int, value: Any) -> Fields:
        """A :class:`Fields` for a value found under ``key`` (a mapping entry or list index)."""
        return Fields(value, file=self.file, path=self.where(key))
