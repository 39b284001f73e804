"""What an emulated local cluster may change while a job runs: a device's slowdown from a step on.

    schedule = SlowdownSchedule(base=1.0, changes=((10, 3.0),))   # 3x slower from step 10 on
    schedule.at(12)                                                # 3.0
    parse_straggler("local/1:3x@10")                               # Straggler("local/1", 3.0, 10)

Real clusters change speed while a job runs (shared nodes, thermal throttling, noisy neighbours); on
one machine hetplan emulates that by changing an emulated device's slowdown factor at a step, from a
cluster file (``emulate: {..., changes: [{step: 10, slowdown: 3.0}]}``) or from
``hetplan launch --straggler DEVICE:FACTORx@STEP``. Factors are relative to the device's base type,
as ``slowdown`` is; they are emulation, and labelled so wherever they show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hetplan.errors import HetplanError

__all__ = ["SlowdownSchedule", "Straggler", "parse_straggler"]

_STRAGGLER = re.compile(r"(?P<device>[^:\s]+/\d+):(?P<factor>\d+(?:\.\d+)?)x@(?P<step>\d+)")


@dataclass(frozen=True)
class SlowdownSchedule:
    """An emulated device's slowdown by step: ``base`` until the first change, then each change's."""

    base: float = 1.0
    changes: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        steps = [s for s, _ in self.changes]
        if steps != sorted(set(steps)):
            raise ValueError(f"slowdown changes must be at increasing steps, got {steps}")
        if self.base < 1.0 or any(f < 1.0 for _, f in self.changes):
            raise ValueError("an emulated slowdown is at least 1 (an emulated device is never faster than its base)")

    def at(self, step: int) -> float:
        factor = self.base
        for start, value in self.changes:
            if step >= start:
                factor = value
        return factor

    def with_change(self, step: int, factor: float) -> SlowdownSchedule:
        """This schedule with one more change (a change at the same step replaces the old one)."""
        changes = dict(self.changes)
        changes[step] = factor
        return SlowdownSchedule(self.base, tuple(sorted(changes.items())))


@dataclass(frozen=True)
class Straggler:
    """``DEVICE:FACTORx@STEP``: device ``device`` runs ``factor`` times slower than its base from ``step``."""

    device: str
    factor: float
    step: int


def parse_straggler(text: str, *, field: str = "--straggler") -> Straggler:
    """Parse ``node0/1:3x@10``; a one-line error names the option and the expected form."""
    match = _STRAGGLER.fullmatch(text.strip())
    if not match:
        raise HetplanError(f"expected DEVICE:FACTORx@STEP (for example local/1:3x@10), got {text!r}", field=field)
    factor = float(match["factor"])
    if factor < 1.0:
        raise HetplanError(f"a straggler factor is at least 1 (slower than the base type), got {factor:g}", field=field)
    return Straggler(device=match["device"], factor=factor, step=int(match["step"]))
