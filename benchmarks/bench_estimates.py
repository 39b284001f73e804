"""Check analytic time estimates against real per-layer measurements: absolute times and ratios.

    .venv/bin/python benchmarks/bench_estimates.py                 # both math regimes, tables
    .venv/bin/python benchmarks/bench_estimates.py --dtype tf32    # one regime
    .venv/bin/python benchmarks/bench_estimates.py --json          # the numbers, for scripts and tests

Inputs: Sailor's ``profiles.json`` (eth-easl/sailor, MIT), real forward/backward seconds per layer
measured on V100-16GB, A100-40GB, A100-80GB, GH200, TITAN RTX, RTX 2080 and RTX 3090, read from
``../shared/external/sailor`` (beside the repository; never copied into it) with hetplan's importer.
Without that folder the script says so and exits 0.

What is compared, per model, GPU type and micro-batch size (tensor-parallel degree 1 only: the
analytic model has no tensor parallelism), on the transformer layers (the importer's
``transformer`` blocks; their median over the layers, which the file times almost identically):

(a) the analytic time of one layer (``attention`` + ``mlp`` sub-blocks of the ``gpt`` family at
    the model's hidden size, sequence, heads) against the measured one: forward, backward, and
    their sum; error = estimate / measured - 1;
(b) for every pair of GPU types at the same model and micro-batch size, the ratio of their
    forward+backward times, estimated against measured; an *inversion* is a pair the estimate
    orders the other way round from the measurement, when the measurement is not a tie (more
    than 5% apart).

"before" is the single-roof model of git HEAD before this change (one 0.65 x peak efficiency for
every type, ``Efficiency()``), "after" the achieved-efficiency model (profiles/devices.yaml).
Both are computed at the same math regime; the regime is the one question the data do not state
(docs/estimates.md, "Which math the measurements ran"), so both are reported.

Models whose training config is not beside the profile (LLAMA-3-8, OPT-30: no sequence length,
so no FLOPs) are skipped, and said to be.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetplan.contracts.catalog import load_catalog  # noqa: E402
from hetplan.errors import HetplanError  # noqa: E402
from hetplan.profile.analytic.base import BlockCost  # noqa: E402
from hetplan.profile.analytic.build import block_times  # noqa: E402
from hetplan.profile.analytic.gpt import lm_head_block  # noqa: E402
from hetplan.profile.analytic.transformer import attention_block, mlp_block  # noqa: E402
from hetplan.profile.efficiency import achieved  # noqa: E402
from hetplan.profile.importers.sailor import import_sailor  # noqa: E402
from hetplan.profile.roofline import Efficiency, block_seconds  # noqa: E402

SAILOR = ROOT.parent / "shared" / "external" / "sailor" / "profiles.json"
MODELS = ("OPT-350", "GPT-Neo-2.7", "LLAMA-3-8", "OPT-30")
REGIMES = ("tf32", "fp16")
#: A measured ratio within 5% of 1 is a tie: neither order is an inversion.
TIE = 1.05
LEGACY = Efficiency()  # git HEAD's constants: compute_max 0.65, work_half 256, memory 0.8, 5 us


@dataclass(frozen=True)
class Point:
    """One model x GPU type x micro-batch: measured and estimated seconds of one layer."""

    model: str
    device: str
    m: int
    measured: tuple[float, float]
    before: tuple[float, float]
    after: tuple[float, float]

    def error(self, which: str, part: int | None = None) -> float:
        """estimate / measured - 1, for forward (0), backward (1) or their sum (None)."""
        est = getattr(self, which)
        if part is None:
            return sum(est) / sum(self.measured) - 1.0
        return est[part] / self.measured[part] - 1.0


def _legacy(cost: BlockCost, device, dtype: str, m: int) -> tuple[float, float]:
    """The single-roof estimate (the model before achieved efficiencies), as the analytic
    profiler computes it when given ``LEGACY`` efficiency."""
    timing = block_times(cost, device, dtype, [m], efficiency=LEGACY)[m]
    return timing.fwd, timing.bwd


def _sum(pairs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def collect(path: Path, dtype: str) -> tuple[list[Point], list[str]]:
    """Every comparable point of the file at math regime ``dtype``, and what was skipped and why."""
    catalog = load_catalog()
    points: list[Point] = []
    skipped: list[str] = []
    for model in MODELS:
        try:
            profile = import_sailor(path, model=model, tensor_parallel=1)
        except HetplanError as exc:
            skipped.append(f"{model}: {exc}")
            continue
        cfg = profile.model["config"]
        s, h, a = cfg["sequence_length"], cfg["hidden_size"], cfg["heads"]
        d = 2 if dtype in ("fp16", "bf16") else 4
        layer = [
            attention_block("attn", seq=s, hidden=h, heads=a, dtype_bytes=d),
            mlp_block("mlp", seq=s, hidden=h, ffn=4 * h, dtype_bytes=d),
        ]
        layers = [b for b in profile.blocks if b.kind == "transformer"]
        for name in profile.device_types():
            device = catalog.get(name)
            for m in sorted(layers[0].times[name]):
                fwd = statistics.median(b.times[name][m].fwd for b in layers)
                bwd = statistics.median(b.times[name][m].bwd for b in layers)
                points.append(
                    Point(
                        model=model,
                        device=name,
                        m=m,
                        measured=(fwd, bwd),
                        before=_sum([_legacy(c, device, dtype, m) for c in layer]),
                        after=_sum([block_seconds(c, device, dtype, m) for c in layer]),
                    )
                )
    return points, skipped


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), without numpy."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _abs_stats(errors: Sequence[float]) -> dict[str, float]:
    mags = [abs(e) for e in errors]
    return {"median": _quantile(mags, 0.5), "p90": _quantile(mags, 0.9), "n": len(mags)}


def ratio_rows(points: Sequence[Point]) -> list[dict[str, object]]:
    """Every pair of GPU types at the same model and micro-batch: measured and estimated ratios."""
    by_key: dict[tuple[str, int], list[Point]] = {}
    for p in points:
        by_key.setdefault((p.model, p.m), []).append(p)
    rows = []
    for (model, m), group in sorted(by_key.items()):
        for x, y in itertools.combinations(sorted(group, key=lambda p: p.device), 2):
            measured = sum(x.measured) / sum(y.measured)
            row: dict[str, object] = {"model": model, "m": m, "pair": f"{x.device}/{y.device}", "measured": measured}
            for which in ("before", "after"):
                est = sum(getattr(x, which)) / sum(getattr(y, which))
                row[which] = est
                row[f"{which}_error"] = est / measured - 1.0
                tie = abs(math.log(measured)) < math.log(TIE)
                row[f"{which}_inverted"] = (not tie) and (est > 1.0) != (measured > 1.0)
            rows.append(row)
    return rows


def summarize(points: Sequence[Point]) -> dict[str, object]:
    """Error statistics before and after, per part, per device type, and for ratios."""
    out: dict[str, object] = {"points": len(points)}
    for which in ("before", "after"):
        out[which] = {
            "fwd": _abs_stats([p.error(which, 0) for p in points]),
            "bwd": _abs_stats([p.error(which, 1) for p in points]),
            "step": _abs_stats([p.error(which) for p in points]),
        }
    per_device: dict[str, dict[str, float]] = {}
    for name in sorted({p.device for p in points}):
        mine = [p for p in points if p.device == name]
        per_device[name] = {
            "n": len(mine),
            "before_median": statistics.median(p.error("before") for p in mine),
            "after_median": statistics.median(p.error("after") for p in mine),
            "after_worst": max((p.error("after") for p in mine), key=abs),
        }
    out["per_device"] = per_device
    # How far the real time lies from an estimate: measured / estimated - 1 (the band's direction).
    deviations = [sum(p.measured) / sum(p.after) - 1.0 for p in points]
    out["deviation_after"] = {
        "p10": _quantile(deviations, 0.1),
        "p90": _quantile(deviations, 0.9),
        "min": min(deviations),
        "max": max(deviations),
    }
    rows = ratio_rows(points)
    out["ratios"] = {
        which: {
            **_abs_stats([float(r[f"{which}_error"]) for r in rows]),  # type: ignore[arg-type]
            "inversions": sum(bool(r[f"{which}_inverted"]) for r in rows),
            "inverted": sorted({f"{r['model']} m={r['m']} {r['pair']}" for r in rows if r[f"{which}_inverted"]}),
        }
        for which in ("before", "after")
    }
    ratio_devs = [float(r["measured"]) / float(r["after"]) - 1.0 for r in rows]  # type: ignore[arg-type]
    out["ratio_deviation_after"] = {"p10": _quantile(ratio_devs, 0.1), "p90": _quantile(ratio_devs, 0.9)}
    out["ties"] = sum(abs(math.log(float(r["measured"]))) < math.log(TIE) for r in rows)  # type: ignore[arg-type]
    out["pairs"] = len(rows)
    return out


def same_chip_spread(points: Sequence[Point]) -> float | None:
    """Largest gap between A100-40GB and A100-80GB (the same SXM4 GPU, measured on different
    clusters) at the same model and micro-batch: how far one team's measurement is from another's."""
    by_key = {(p.model, p.m, p.device): p for p in points}
    gaps = [
        abs(sum(by_key[(mo, m, "A100-40GB")].measured) / sum(p.measured) - 1.0)
        for (mo, m, dev), p in by_key.items()
        if dev == "A100-80GB" and (mo, m, "A100-40GB") in by_key
    ]
    return max(gaps) if gaps else None


def head_check(path: Path) -> list[dict[str, object]]:
    """OPT-350's LM head (one 2048 x 1024 x 50272 GEMM and the loss's pass over the logits) at
    micro-batch 1, estimated in each regime against the measurement: a single large GEMM tells
    which math the measurement ran, since its rate cannot be off by the 4-8x between regimes."""
    catalog = load_catalog()
    profile = import_sailor(path, model="OPT-350", tensor_parallel=1)
    cfg = profile.model["config"]
    head = profile.blocks[-1]
    rows = []
    for name in profile.device_types():
        row: dict[str, object] = {"type": name, "measured": head.times[name][1].fwd}
        for dtype in REGIMES:
            d = 2 if dtype in ("fp16", "bf16") else 4
            cost = lm_head_block(seq=cfg["sequence_length"], hidden=cfg["hidden_size"], vocab=cfg["vocab_size"], d=d)
            row[dtype] = block_seconds(cost, catalog.get(name), dtype, 1)[0]
        rows.append(row)
    return rows


def catalog_table(dtypes: Sequence[str] = ("fp16", "fp32", "tf32")) -> list[dict[str, object]]:
    """Achieved GEMM rate, bandwidth and a reference layer's speed per type, relative to V100-16GB."""
    catalog = load_catalog()
    ref = "V100-16GB"
    rows = []
    for dtype in dtypes:
        d = 2 if dtype in ("fp16", "bf16") else 4
        layer = [
            attention_block("attn", seq=1024, hidden=2048, heads=16, dtype_bytes=d),
            mlp_block("mlp", seq=1024, hidden=2048, ffn=8192, dtype_bytes=d),
        ]

        def step(name: str, dtype: str = dtype, layer: list[BlockCost] = layer) -> float:
            return sum(sum(block_seconds(c, catalog.get(name), dtype, 8)) for c in layer)

        base = step(ref)
        for device in catalog:
            if device.name == "cpu":
                continue
            rates = achieved(device, dtype)
            rows.append(
                {
                    "dtype": dtype,
                    "type": device.name,
                    "peak_tflops": device.peak_flops(dtype) / 1e12,
                    "gemm_tflops": rates.gemm_flops / 1e12,
                    "speed_vs_v100": base / step(device.name),
                    "paper_vs_v100": device.peak_flops(dtype) / catalog.get(ref).peak_flops(dtype),
                }
            )
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def print_report(path: Path, regimes: Sequence[str]) -> None:
    print("\n## which math the measurements ran: OPT-350 LM head forward at micro-batch 1, ms")
    print("\n| type | measured | estimated, fp32 math (tf32 where the type has it) | estimated, fp16 |")
    print("|---|---|---|---|")
    for row in head_check(path):
        print(f"| {row['type']} | {1e3 * row['measured']:.2f} | {1e3 * row['tf32']:.2f} | {1e3 * row['fp16']:.2f} |")
    for dtype in regimes:
        points, skipped = collect(path, dtype)
        s = summarize(points)
        print(f"\n## math regime {dtype}: {s['points']} points (model x GPU type x micro-batch), {s['pairs']} pairs")
        for line in skipped:
            print(f"skipped {line.splitlines()[0][:160]}")
        print("\n| per-layer |abs error| | before median | before p90 | after median | after p90 |")
        print("|---|---|---|---|---|")
        for part in ("fwd", "bwd", "step"):
            b, a = s["before"][part], s["after"][part]  # type: ignore[index]
            print(f"| {part} | {_pct(b['median'])} | {_pct(b['p90'])} | {_pct(a['median'])} | {_pct(a['p90'])} |")
        r = s["ratios"]  # type: ignore[assignment]
        print(
            f"| ratio between types (fwd+bwd) | {_pct(r['before']['median'])} | {_pct(r['before']['p90'])} "
            f"| {_pct(r['after']['median'])} | {_pct(r['after']['p90'])} |"
        )
        print(
            f"| ratio inversions (of {s['pairs']} pairs, {s['ties']} ties) | {r['before']['inversions']} | "
            f"| {r['after']['inversions']} | |"
        )
        print("\n| type | points | before: median error | after: median error | after: worst |")
        print("|---|---|---|---|---|")
        for name, row in s["per_device"].items():  # type: ignore[union-attr]
            print(
                f"| {name} | {row['n']} | {row['before_median']:+.0%} | {row['after_median']:+.0%} "
                f"| {row['after_worst']:+.0%} |"
            )
        print(f"\ninverted after: {', '.join(r['after']['inverted']) or 'none'}")
        print(f"inverted before: {', '.join(r['before']['inverted']) or 'none'}")
        dev, rdev = s["deviation_after"], s["ratio_deviation_after"]  # type: ignore[index]
        print(
            f"measured / estimated - 1 (after): times p10..p90 {dev['p10']:+.1%} .. {dev['p90']:+.1%}, "
            f"min..max {dev['min']:+.1%} .. {dev['max']:+.1%}; ratios p10..p90 {rdev['p10']:+.1%} .. {rdev['p90']:+.1%}"
        )
        spread = same_chip_spread(points)
        if spread is not None:
            print(f"A100-40GB vs A100-80GB measurements (same GPU chip, different clusters): up to {spread:.1%} apart")
    print("\n## catalog: achieved GEMM rate and a reference layer (h 2048, s 1024, micro-batch 8) vs V100-16GB")
    print("\n| dtype | type | peak TFLOP/s | achieved GEMM TFLOP/s | layer speed vs V100 | paper peak vs V100 |")
    print("|---|---|---|---|---|---|")
    for row in catalog_table():
        print(
            f"| {row['dtype']} | {row['type']} | {row['peak_tflops']:.1f} | {row['gemm_tflops']:.1f} "
            f"| {row['speed_vs_v100']:.2f} | {row['paper_vs_v100']:.2f} |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=(*REGIMES, "both"), default="both", help="math regime to estimate at")
    parser.add_argument("--profiles", type=Path, default=SAILOR, help="Sailor profiles.json")
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = parser.parse_args(argv)
    if not args.profiles.is_file():
        print(f"skipped: {args.profiles} is absent (the external measurements live beside the repository)")
        return 0
    regimes = REGIMES if args.dtype == "both" else (args.dtype,)
    if args.json:
        out = {}
        for dtype in regimes:
            points, skipped = collect(args.profiles, dtype)
            out[dtype] = {**summarize(points), "skipped": skipped, "same_chip_spread": same_chip_spread(points)}
        out["head_check"] = head_check(args.profiles)
        print(json.dumps(out, indent=1))
    else:
        print(f"# bench_estimates: {args.profiles}")
        print_report(args.profiles, regimes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
