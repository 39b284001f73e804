"""What-if tables and the Pareto picture, rendered from the summary mapping of
:func:`hetplan.solve.whatif_report.what_if_summary` (views do not import the planner).

    print_all(what_if_renderables(summary))
    Path("pareto.svg").write_text(pareto_svg(summary))
    Path("pareto.png").write_bytes(pareto_png(summary))     # needs the optional matplotlib
"""

from __future__ import annotations

import io
from html import escape
from typing import Any

from rich.table import Table
from rich.text import Text

from hetplan.errors import HetplanError
from hetplan.units import format_time

__all__ = ["pareto_png", "pareto_svg", "usd", "what_if_renderables"]


def usd(value: float | None) -> str:
    """Dollars with enough digits for a cent fraction ($0.000123 per sample), '-' when unknown."""
    if value is None:
        return "-"
    if value == 0:
        return "$0"
    if abs(value) >= 100:
        return f"${value:,.0f}"
    if abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.3g}"


def _signed_usd(value: float | None) -> str:
    if value is None:
        return "-"
    return ("+" if value > 0 else "-" if value < 0 else "") + usd(abs(value))


def what_if_renderables(summary: dict[str, Any]) -> list[Any]:
    """Headline, the kinds, a row per planned candidate (best plan on each), marginals, notes."""
    out: list[Any] = []
    chosen = summary["chosen"]
    head = Text()
    if chosen is None:
        head.append(
            f"what-if ({summary['objective']}): no candidate has a plan that meets the objective", style="bold red"
        )
    else:
        head.append(f"what-if ({summary['objective']}): {chosen['change']}", style="bold")
        head.append(
            f"   {format_time(chosen['iteration_s'])}/step, {chosen['samples_per_s']:,.1f} samples/s, "
            f"{usd(chosen['usd_per_step'])}/step"
        )
    out.append(head)
    proof = "exact" if summary["exact"] else f"stopped early: best bound left {summary['gap']:.1%} below"
    out.append(
        Text(
            f"{summary['candidates']} candidate clusters, {summary['planned']} planned, "
            f"{summary['pruned']} ruled out by bounds ({proof})"
        )
    )
    kinds = Table(title="Node kinds", title_justify="left")
    for col in ("kind", "devices per node", "$/h per node", "in cluster", "available", "counts tried"):
        kinds.add_column(col)
    for k in summary["kinds"]:
        tried = k["counts_tried"]
        kinds.add_row(
            k["name"],
            " + ".join(f"{n} x {t}" for t, n in k["devices"].items()),
            usd(k["usd_per_hour"]),
            str(k["in_cluster"]),
            str(k["available"]),
            "all" if len(tried) == k["available"] + 1 else ", ".join(map(str, tried)),
        )
    out.append(kinds)
    table = Table(title="Candidates planned (best plan on each; * chosen, p Pareto front)", title_justify="left")
    for col in ("", "nodes", "change", "devices"):
        table.add_column(col)
    for col in ("iteration", "samples/s", "$/h", "$/step", "$/sample"):
        table.add_column(col, justify="right")
    if summary["run_samples"] is not None:
        table.add_column("hours/run", justify="right")
        table.add_column("$/run", justify="right")
    pareto = summary["pareto"]
    for r in summary["rows"]:
        mark = ("*" if r["chosen"] else "") + ("p" if r["counts"] in pareto else "")
        nodes = " ".join(f"{c}" for c in r["counts"].values())
        used = f"{r['used_devices']}/{r['devices']}" if "iteration_s" in r else str(r["devices"])
        if "iteration_s" not in r:
            cells = [f"no plan: {r['no_plan']}", "-", usd(r["usd_per_hour"]), "-", "-"]
        else:
            cells = [
                format_time(r["iteration_s"]),
                f"{r['samples_per_s']:,.1f}",
                usd(r["usd_per_hour"]),
                usd(r["usd_per_step"]),
                usd(r["usd_per_sample"]),
            ]
        if summary["run_samples"] is not None:
            cells += [f"{r['run_hours']:,.2f}", usd(r["usd_per_run"])] if "iteration_s" in r else ["-", "-"]
        table.add_row(mark, nodes, r["change"], used, *cells)
    out.append(table)
    out.append(Text("nodes: " + ", ".join(k["name"] for k in summary["kinds"]) + " (counts, in that order)"))
    if summary["marginals"]:
        marg = Table(title="Marginal: one node more or less than the chosen cluster", title_justify="left")
        for col in ("kind", "nodes"):
            marg.add_column(col)
        for col in ("iteration", "speed-up", "$/h", "$/step"):
            marg.add_column(col, justify="right")
        for m in summary["marginals"]:
            if "iteration_s" not in m:
                marg.add_row(m["kind"], f"{m['nodes']:+d}", f"no plan: {m['no_plan']}", "-", "-", "-")
                continue
            marg.add_row(
                m["kind"],
                f"{m['nodes']:+d}",
                format_time(m["iteration_s"]),
                f"{m['speedup']:.3f}x",
                _signed_usd(m.get("usd_per_hour")),
                _signed_usd(m.get("usd_per_step")),
            )
        out.append(marg)
    for note in summary["notes"]:
        out.append(Text(note, style="yellow"))
    return out


_W, _H, _PAD = 640, 420, 60


def _points(summary: dict[str, Any]) -> tuple[list[tuple[float, float, bool, bool, str]], tuple[float, ...]]:
    pareto = summary["pareto"]
    pts = [
        (r["iteration_s"], r["usd_per_step"], r["counts"] in pareto, r["chosen"], r["change"])
        for r in summary["rows"]
        if r.get("usd_per_step") is not None
    ]
    if not pts:
        raise HetplanError("no priced candidate to draw: the Pareto front needs prices", field="--pareto")
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 * 0.9, x1 * 1.1 + 1e-12
    if y1 == y0:
        y0, y1 = y0 * 0.9, y1 * 1.1 + 1e-12
    return pts, (x0, x1, y0, y1)


def pareto_svg(summary: dict[str, Any]) -> str:
    """Iteration time (x) against $/step (y) of every planned candidate; the front joined, the
    chosen one ringed. Plain SVG, no dependencies; the same summary gives the same bytes."""
    pts, (x0, x1, y0, y1) = _points(summary)

    def sx(x: float) -> float:
        return _PAD + (x - x0) / (x1 - x0) * (_W - 2 * _PAD)

    def sy(y: float) -> float:
        return _H - _PAD - (y - y0) / (y1 - y0) * (_H - 2 * _PAD)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" font-family="sans-serif" font-size="11">',
        f'<rect width="{_W}" height="{_H}" fill="white"/>',
        f'<text x="{_W / 2}" y="20" text-anchor="middle" font-size="13">'
        f"what-if ({escape(summary['objective'])}): time against cost per step</text>",
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="black"/>',
        f'<line x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_H - _PAD}" stroke="black"/>',
        f'<text x="{_W / 2}" y="{_H - 20}" text-anchor="middle">iteration time (s)</text>',
        f'<text x="16" y="{_H / 2}" text-anchor="middle" transform="rotate(-90 16 {_H / 2})">$ per step</text>',
    ]
    for i in range(5):
        x = x0 + (x1 - x0) * i / 4
        y = y0 + (y1 - y0) * i / 4
        parts.append(f'<text x="{sx(x):.1f}" y="{_H - _PAD + 15}" text-anchor="middle">{x:.3g}</text>')
        parts.append(f'<text x="{_PAD - 5}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.3g}</text>')
    front = sorted((p for p in pts if p[2]), key=lambda p: p[0])
    if len(front) > 1:
        path = " ".join(f"{sx(p[0]):.1f},{sy(p[1]):.1f}" for p in front)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#d62728" stroke-width="1.5"/>')
    for x, y, on_front, chosen, label in pts:
        color = "#d62728" if on_front else "#7f7f7f"
        parts.append(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{color}"><title>{escape(label)}</title></circle>'
        )
        if chosen:
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="8" fill="none" stroke="black"/>')
        if on_front:
            parts.append(f'<text x="{sx(x) + 7:.1f}" y="{sy(y) - 6:.1f}">{escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def pareto_png(summary: dict[str, Any]) -> bytes:
    """The same picture drawn with matplotlib (optional: ``pip install 'hetplan[png]'``)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise HetplanError(
            "a PNG Pareto front needs matplotlib: pip install 'hetplan[png]' (or write .svg)", field="--pareto"
        ) from None
    pts, _ = _points(summary)
    fig = Figure(figsize=(_W / 100, _H / 100), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], c=["#d62728" if p[2] else "#7f7f7f" for p in pts], s=16)
    front = sorted((p for p in pts if p[2]), key=lambda p: p[0])
    ax.plot([p[0] for p in front], [p[1] for p in front], color="#d62728")
    for x, y, _, _chosen, label in front:
        ax.annotate(label, (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    for x, y, _, chosen, _label in pts:
        if chosen:
            ax.scatter([x], [y], s=120, facecolors="none", edgecolors="black")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("$ per step")
    ax.set_title(f"what-if ({summary['objective']}): time against cost per step")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()
