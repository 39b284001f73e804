"""Unit strings that people write in cluster files: ``"600GB/s"``, ``"100Gbps"``, ``"80GiB"``, ``"5us"``.

Every parser takes a plain number too (already in base units: bytes, bytes/s, seconds) and returns a
float in base units. A string that does not parse raises ``ValueError`` whose text says what was
expected; the contract loaders add the file and field.

    >>> parse_bandwidth("100Gbps")
    12500000000.0
    >>> parse_bytes("16GiB")
    17179869184.0
    >>> parse_time("5us")
    5e-06
"""

from __future__ import annotations

import math
import re

__all__ = ["format_bandwidth", "format_bytes", "format_time", "parse_bandwidth", "parse_bytes", "parse_time"]

# A sign is accepted so that "-5GB/s" parses to a negative number and the caller (the contract
# loader) can say "expected a positive value" instead of "not a bandwidth".
_NUMBER = r"(?P<num>[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}

_BYTES_RE = re.compile(_NUMBER + r"(?P<prefix>[kKMGTP]i?)?(?P<unit>B)$")
_RATE_RE = re.compile(_NUMBER + r"(?P<prefix>[kKMGTP]i?)?(?P<unit>B/s|bps|bit/s|b/s)$")
_TIME_RE = re.compile(_NUMBER + r"(?P<unit>ns|us|µs|ms|s|min)$")
# Divide by the per-second count rather than multiply by 1e-6: 5 / 1e6 is exactly 5e-06, 5 * 1e-6 is not.
_TIME_DIVISOR = {"ns": 1e9, "us": 1e6, "µs": 1e6, "ms": 1e3, "s": 1.0, "min": 1 / 60.0}


def _plain_number(value: object, what: str, example: str) -> float | None:
    if isinstance(value, bool):
        raise ValueError(f"expected {what} such as '{example}', got {value!r}")
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            raise ValueError(f"expected {what} that is a finite number, got {value!r}") from None
        return _finite(number, what, value)
    if not isinstance(value, str):
        raise ValueError(f"expected {what} such as '{example}', got {type(value).__name__} {value!r}")
    return None


def _finite(number: float, what: str, value: object) -> float:
    """``number`` unless it overflowed: ``"1e999GB"`` is not a size anyone means."""
    if not math.isfinite(number):
        raise ValueError(f"expected {what} that is a finite number, got {value!r}")
    return number


def _prefix_scale(prefix: str | None) -> float:
    if not prefix:
        return 1.0
    return _BINARY[prefix] if prefix.endswith("i") else _DECIMAL[prefix]


def parse_bytes(value: object) -> float:
    """Bytes from ``"80GiB"``, ``"16GB"``, ``"512MB"`` or a number of bytes."""
    number = _plain_number(value, "a size", "80GiB")
    if number is not None:
        return number
    match = _BYTES_RE.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"expected a size such as '80GiB' or '16GB', got {value!r}")
    return _finite(float(match["num"]) * _prefix_scale(match["prefix"]), "a size", value)


def parse_bandwidth(value: object) -> float:
    """Bytes per second from ``"600GB/s"``, ``"100Gbps"`` (bits), ``"25Gbit/s"`` or a number of B/s."""
    number = _plain_number(value, "a bandwidth", "100Gbps")
    if number is not None:
        return number
    match = _RATE_RE.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"expected a bandwidth such as '600GB/s' or '100Gbps', got {value!r}")
    scale = _prefix_scale(match["prefix"])
    per_bit = match["unit"] in ("bps", "bit/s", "b/s")
    return _finite(float(match["num"]) * scale / (8.0 if per_bit else 1.0), "a bandwidth", value)


def parse_time(value: object) -> float:
    """Seconds from ``"5us"``, ``"2ms"``, ``"1.5s"`` or a number of seconds."""
    number = _plain_number(value, "a duration", "5us")
    if number is not None:
        return number
    match = _TIME_RE.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"expected a duration such as '5us' or '2ms', got {value!r}")
    return _finite(float(match["num"]) / _TIME_DIVISOR[match["unit"]], "a duration", value)


def format_bytes(n: float) -> str:
    """Human-readable binary size: ``17179869184 -> '16.0 GiB'``."""
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def format_bandwidth(bps: float) -> str:
    """Bytes/s as GB/s (decimal), the unit vendors quote."""
    if bps >= 1e9:
        return f"{bps / 1e9:.1f} GB/s"
    return f"{bps / 1e6:.1f} MB/s"


def format_time(seconds: float) -> str:
    """Seconds in the unit that reads best (s, ms, us)."""
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"
