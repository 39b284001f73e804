"""Draw a simulated iteration: one row per device, forward / backward / transfer / sync coloured.

    result = simulate(plan, profile, cluster, timeline=True)
    write_timeline(result, "plan.svg", title="gpt on mixed-a100-v100")

Compute fills the upper part of a device's row; its outgoing transfers and its all-reduces are
drawn as a thin band under it, so overlap of communication with compute is visible at a glance.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from planner.errors import HetplanError
from planner.simulate.simulator import SimResult

__all__ = ["COLOURS", "render_svg", "write_timeline"]

COLOURS = {"F": "#4C78A8", "B": "#54A24B", "step": "#9D755D", "send": "#F58518", "allreduce": "#B279A2"}
LEGEND = {"F": "forward", "B": "backward", "send": "transfer", "allreduce": "gradient all-reduce", "step": "optimizer"}


def _nice_step(span_ms: float, ticks: int = 10) -> float:
    raw = span_ms / ticks
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 10 ** -len(str(int(1 / raw)))
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def render_svg(result: SimResult, *, title: str = "", width: int = 1200, row_height: int = 22) -> str:
    """The timeline as SVG text (self-contained, readable in any browser)."""
    if not result.timeline:
        raise HetplanError("no timeline was recorded; simulate with timeline=True")
    rows = list(result.devices)
    label_w, top, bottom = 230, 50, 60
    plot_w = width - label_w - 20
    height = top + row_height * len(rows) + bottom
    total = result.iteration_s or 1.0
    scale = plot_w / total
    index = {r: i for i, r in enumerate(rows)}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        f'font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title or "hetplan timeline")}</text>',
        f'<text x="10" y="38">iteration {total * 1e3:.3f} ms, bubble {result.bubble_fraction:.1%}, '
        f"bottleneck: {escape(result.bottleneck)}</text>",
    ]
    for address, i in index.items():
        d = result.devices[address]
        y = top + i * row_height
        if i % 2 == 0:
            out.append(f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{row_height}" fill="#f4f4f4"/>')
        out.append(
            f'<text x="{label_w - 6}" y="{y + row_height * 0.65:.1f}" text-anchor="end">'
            f"{escape(address)} {escape(d.type)} p{d.pipeline}s{d.stage}</text>"
        )
    for row, kind, lo, hi, label in result.timeline:
        y = top + index[row] * row_height
        x = label_w + lo * scale
        w = max((hi - lo) * scale, 0.5)
        if kind in ("F", "B", "step"):
            y0, h = y + 2, row_height * 0.62
        else:
            y0, h = y + row_height * 0.68, row_height * 0.28
        out.append(
            f'<rect x="{x:.2f}" y="{y0:.1f}" width="{w:.2f}" height="{h:.1f}" fill="{COLOURS[kind]}" '
            f'stroke="white" stroke-width="0.3"><title>{escape(label)}: {lo * 1e3:.3f}-{hi * 1e3:.3f} ms'
            f"</title></rect>"
        )
    axis_y = top + row_height * len(rows) + 4
    out.append(f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + plot_w}" y2="{axis_y}" stroke="black"/>')
    step = _nice_step(total * 1e3)
    tick = 0.0
    while tick <= total * 1e3 + 1e-9:
        x = label_w + tick / 1e3 * scale
        out.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 4}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 15}" text-anchor="middle">{tick:g}</text>')
        tick += step
    out.append(f'<text x="{label_w + plot_w / 2}" y="{axis_y + 30}" text-anchor="middle">time (ms)</text>')
    lx = label_w
    for kind, name in LEGEND.items():
        out.append(f'<rect x="{lx}" y="{height - 16}" width="12" height="10" fill="{COLOURS[kind]}"/>')
        out.append(f'<text x="{lx + 16}" y="{height - 7}">{name}</text>')
        lx += 30 + 7 * len(name)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_timeline(result: SimResult, path: str | Path, *, title: str = "") -> None:
    """Write the timeline as ``.svg``."""
    target = Path(path)
    if target.suffix.lower() != ".svg":
        raise HetplanError(f"unsupported timeline format {target.suffix!r}; use a .svg file", field="--timeline")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_svg(result, title=title), encoding="utf-8")
