"""Draw a simulated iteration: one row per device, forward / backward / transfer / sync coloured.

    result = simulate(plan, profile, cluster, timeline=True)
    write_timeline(result, "plan.svg", title="gpt on mixed-a100-v100")   # or "plan.png"

Compute fills the upper part of a device's row; its outgoing transfers and its all-reduces are
drawn as a thin band under it, so overlap of communication with compute is visible at a glance.

One layout (:func:`layout`: rectangles, lines and text in pixel coordinates) is drawn two ways:
as SVG text, and rasterised to PNG by :mod:`planner.simulate.png` (numpy and zlib only, with a 5x7
bitmap font), so the two pictures agree.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import NamedTuple

from planner.errors import HetplanError
from planner.simulate.png import Canvas
from planner.simulate.simulator import SimResult

__all__ = ["COLOURS", "LEGEND", "Layout", "bar_box", "layout", "render_png", "render_svg", "write_timeline"]

COLOURS = {"F": "#4C78A8", "B": "#54A24B", "step": "#9D755D", "send": "#F58518", "allreduce": "#B279A2"}
LEGEND = {"F": "forward", "B": "backward", "send": "transfer", "allreduce": "gradient all-reduce", "step": "optimizer"}
ROW_BACKGROUND = "#f4f4f4"
LABEL_W, TOP, BOTTOM, RIGHT = 230, 50, 60, 20  # margins, pixels


class Rect(NamedTuple):
    x: float
    y: float
    w: float
    h: float
    fill: str
    tooltip: str = ""  # set for timeline tasks (the SVG shows it on hover)


class Line(NamedTuple):
    x1: float
    y1: float
    x2: float
    y2: float


class Text(NamedTuple):
    x: float
    y: float  # baseline
    text: str
    anchor: str = "start"  # start, middle, end (as SVG's text-anchor)
    size: int = 11  # SVG font size; the bitmap font draws 11 at scale 1, larger at scale 2
    bold: bool = False


class Layout(NamedTuple):
    width: int
    height: int
    shapes: list[Rect | Line | Text]


def _nice_step(span_ms: float, ticks: int = 10) -> float:
    raw = span_ms / ticks
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 10 ** -len(str(int(1 / raw)))
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def bar_box(
    row: int, kind: str, lo: float, hi: float, *, scale: float, row_height: int = 22
) -> tuple[float, float, float, float]:
    """``(x, y, w, h)`` in pixels of a task's bar on device row ``row`` (0 = top) at ``scale`` pixels
    per second: compute in the upper part of the row, transfers and all-reduces in a band under it."""
    y = TOP + row * row_height
    x = LABEL_W + lo * scale
    w = max((hi - lo) * scale, 0.5)
    if kind in ("F", "B", "step"):
        return x, y + 2, w, row_height * 0.62
    return x, y + row_height * 0.68, w, row_height * 0.28


def layout(result: SimResult, *, title: str = "", width: int = 1200, row_height: int = 22) -> Layout:
    """The timeline picture as shapes in pixel coordinates (see the module docstring)."""
    if not result.timeline:
        raise HetplanError("no timeline was recorded; simulate with timeline=True")
    rows = list(result.devices)
    plot_w = width - LABEL_W - RIGHT
    height = TOP + row_height * len(rows) + BOTTOM
    total = result.iteration_s or 1.0
    scale = plot_w / total
    index = {r: i for i, r in enumerate(rows)}
    shapes: list[Rect | Line | Text] = [
        Rect(0, 0, width, height, "white"),
        Text(10, 20, title or "hetplan timeline", size=14, bold=True),
        Text(
            10,
            38,
            f"iteration {total * 1e3:.3f} ms, bubble {result.bubble_fraction:.1%}, bottleneck: {result.bottleneck}",
        ),
    ]
    for address, i in index.items():
        d = result.devices[address]
        y = TOP + i * row_height
        if i % 2 == 0:
            shapes.append(Rect(LABEL_W, y, plot_w, row_height, ROW_BACKGROUND))
        shapes.append(Text(LABEL_W - 6, y + row_height * 0.65, f"{address} {d.type} p{d.pipeline}s{d.stage}", "end"))
    for row, kind, lo, hi, label in result.timeline:
        x, y, w, h = bar_box(index[row], kind, lo, hi, scale=scale, row_height=row_height)
        shapes.append(Rect(x, y, w, h, COLOURS[kind], f"{label}: {lo * 1e3:.3f}-{hi * 1e3:.3f} ms"))
    axis_y = TOP + row_height * len(rows) + 4
    shapes.append(Line(LABEL_W, axis_y, LABEL_W + plot_w, axis_y))
    step = _nice_step(total * 1e3)
    tick = 0.0
    while tick <= total * 1e3 + 1e-9:
        x = LABEL_W + tick / 1e3 * scale
        shapes.append(Line(x, axis_y, x, axis_y + 4))
        shapes.append(Text(x, axis_y + 15, f"{tick:g}", "middle"))
        tick += step
    shapes.append(Text(LABEL_W + plot_w / 2, axis_y + 30, "time (ms)", "middle"))
    lx = LABEL_W
    for kind, name in LEGEND.items():
        shapes.append(Rect(lx, height - 16, 12, 10, COLOURS[kind]))
        shapes.append(Text(lx + 16, height - 7, name))
        lx += 30 + 7 * len(name)
    return Layout(width, height, shapes)


def render_svg(result: SimResult, *, title: str = "", width: int = 1200, row_height: int = 22) -> str:
    """The timeline as SVG text (self-contained, readable in any browser)."""
    picture = layout(result, title=title, width=width, row_height=row_height)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{picture.width}" height="{picture.height}" '
        f'font-family="sans-serif" font-size="11">'
    ]
    for s in picture.shapes:
        if isinstance(s, Rect):
            if s.tooltip:  # a timeline task: fractional position, a hairline between neighbours
                out.append(
                    f'<rect x="{s.x:.2f}" y="{s.y:.1f}" width="{s.w:.2f}" height="{s.h:.1f}" fill="{s.fill}" '
                    f'stroke="white" stroke-width="0.3"><title>{escape(s.tooltip)}</title></rect>'
                )
            else:
                out.append(f'<rect x="{s.x:g}" y="{s.y:g}" width="{s.w:g}" height="{s.h:g}" fill="{s.fill}"/>')
        elif isinstance(s, Line):
            out.append(f'<line x1="{s.x1:g}" y1="{s.y1:g}" x2="{s.x2:g}" y2="{s.y2:g}" stroke="black"/>')
        else:
            attrs = f'x="{s.x:g}" y="{s.y:.1f}"'
            if s.anchor != "start":
                attrs += f' text-anchor="{s.anchor}"'
            if s.size != 11:
                attrs += f' font-size="{s.size}"'
            if s.bold:
                attrs += ' font-weight="bold"'
            out.append(f"<text {attrs}>{escape(s.text)}</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render_png(result: SimResult, *, title: str = "", width: int = 1200, row_height: int = 22) -> bytes:
    """The same picture as :func:`render_svg`, rasterised: PNG bytes (8-bit RGB)."""
    picture = layout(result, title=title, width=width, row_height=row_height)
    canvas = Canvas(picture.width, picture.height)
    for s in picture.shapes:
        if isinstance(s, Rect):
            canvas.rect(s.x, s.y, s.w, s.h, s.fill)
            if s.tooltip and s.w >= 4:  # the SVG's white hairline, where a bar is wide enough to spare it
                canvas.rect(s.x, s.y, 1, s.h, "white")
        elif isinstance(s, Line):
            canvas.line(s.x1, s.y1, s.x2, s.y2)
        else:
            canvas.text(s.x, s.y, s.text, scale=2 if s.size >= 14 else 1, anchor=s.anchor, bold=s.bold)
    return canvas.to_png()


def write_timeline(result: SimResult, path: str | Path, *, title: str = "") -> None:
    """Write the timeline as ``.svg`` or ``.png`` (by the file's suffix)."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise HetplanError(
            f"unsupported timeline format {target.suffix!r}; use a .svg or .png file", field="--timeline"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".svg":
        target.write_text(render_svg(result, title=title), encoding="utf-8")
    else:
        target.write_bytes(render_png(result, title=title))
