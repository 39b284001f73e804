"""Say where a measured profile and the analytic formulas disagree.

    from hetplan.profile.compare import compare_with_analytic
    for line in compare_with_analytic(measured, {"family": "gpt", "config": {...}}):
        console.print(f"note: {line}")

Per quantity (FLOPs, parameters, parameter bytes, activation bytes, output bytes), one line when
some block differs from :mod:`hetplan.profile.analytic` by more than :data:`TOLERANCE`, naming up to
three blocks and the totals. Expected differences (docs/profiling.md): the zoo has no dropout, so
the analytic dropout masks are not kept; autograd keeps a few tensors the formulas leave out
(LayerNorm's statistics, the GELU input, token ids) and the last block's activations include what
the loss saves. FLOPs and parameters should agree exactly for the zoo families. No torch needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetplan.contracts.model_profile import ModelProfile
from hetplan.errors import HetplanError
from hetplan.profile.analytic.registry import FAMILIES

__all__ = ["QUANTITIES", "TOLERANCE", "compare_with_analytic"]

TOLERANCE = 0.05
#: (attribute, label, unit) of what is compared.
QUANTITIES: tuple[tuple[str, str, str], ...] = (
    ("flops_fwd", "forward FLOPs", "FLOP"),
    ("params", "parameters", ""),
    ("param_bytes", "parameter bytes", "B"),
    ("activation_bytes", "activation bytes", "B"),
    ("output_bytes", "output bytes", "B"),
)
_SHOWN = 3


def _fmt(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}".rstrip()
    return f"{x:.3g} {unit}".rstrip()


def _differs(measured: float, analytic: float) -> bool:
    if analytic == 0:
        return measured != 0
    return abs(measured - analytic) > TOLERANCE * abs(analytic)


def _pct(measured: float, analytic: float) -> str:
    return "new" if analytic == 0 else f"{100 * (measured - analytic) / analytic:+.0f}%"


def compare_with_analytic(measured: ModelProfile, family_model: Mapping[str, Any]) -> list[str]:
    """Lines saying where ``measured`` differs from the analytic family by more than 5 %.

    Args:
        measured: a measured profile (any dtype; the analytic one is computed at the same dtype).
        family_model: ``{"family": name, "config": {...}}``; a factory model (no family, or a family
            the analytic profiler lacks) has nothing to compare with and gives ``[]``.

    Returns:
        Human-readable lines, empty when everything agrees within the tolerance.
    """
    name = family_model.get("family")
    if name not in FAMILIES:
        return []
    try:
        costs = FAMILIES[name].blocks(family_model.get("config"), measured.dtype)
    except HetplanError as exc:
        return [f"cannot compare with the analytic {name} model: {exc}"]
    got = [b.name for b in measured.blocks]
    want = [c.name for c in costs]
    if got != want:
        return [
            f"the blocks differ from the analytic {name} model: measured {len(got)} ({', '.join(got[:4])}, ...), "
            f"analytic {len(want)} ({', '.join(want[:4])}, ...)"
        ]
    # the analytic costs count a tied table in every block that holds it; the profile lists it once,
    # under ``shared``: each block is compared with the entries it holds
    with_shared = [measured.block_params(i) for i in range(len(got))]
    held = {"params": [p for p, _ in with_shared], "param_bytes": [w for _, w in with_shared]}
    lines = []
    for attr, label, unit in QUANTITIES:
        mine = held.get(attr) or [float(getattr(b, attr)) for b in measured.blocks]
        pairs = [
            (b.name, float(m), float(getattr(c, attr))) for b, c, m in zip(measured.blocks, costs, mine, strict=True)
        ]
        off = [(n, m, a) for n, m, a in pairs if _differs(m, a)]
        if not off:
            continue
        shown = "; ".join(f"{n} {_fmt(m, unit)} vs {_fmt(a, unit)} ({_pct(m, a)})" for n, m, a in off[:_SHOWN])
        more = f"; and {len(off) - _SHOWN} more" if len(off) > _SHOWN else ""
        total_m = sum(m for _, m, _ in pairs)
        total_a = sum(a for _, _, a in pairs)
        lines.append(
            f"{label} differ from the analytic {name} model by more than {TOLERANCE:.0%} in {len(off)} of "
            f"{len(pairs)} blocks (measured vs analytic: {shown}{more}); total {_fmt(total_m, unit)} vs "
            f"{_fmt(total_a, unit)} ({_pct(total_m, total_a)})"
        )
    return lines
