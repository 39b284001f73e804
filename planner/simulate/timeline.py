"""Draw a simulated iteration: one row per device, forward / backward / transfer / sync coloured.

    result = simulate(plan, profile, cluster, timeline=True)
    write_timeline(result, "plan.svg", title="gpt on mixed-a100-v100", cluster=cluster)  # or "plan.png"

Compute fills the upper part of a device's row; its outgoing transfers and its all-reduces are
drawn as a thin band under it, so overlap of communication with compute is visible at a glance.
Given the cluster, the subtitle says when device speeds are emulated (DESIGN.md: emulation is
labelled everywhere it shows).

One layout (:func:`layout`: rectangles, lines and text in pixel coordinates) is drawn two ways:
as SVG text here, and as PNG by matplotlib (:mod:`hetplan.simulate.png`, an optional extra), so the
two pictures agree. To explore an iteration rather than look at it, write a Chrome trace instead
(:mod:`hetplan.simulate.trace`) and open it in Perfetto.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import NamedTuple

from hetplan.contracts.cluster import Cluster
from hetplan.errors import HetplanError
from hetplan.simulate.simulator import SimResult

__all__ = [
    "COLOURS",
    "LEGEND",
    "Layout",
    "bar_box",
    "check_timeline_path",
    "layout",
    "render_png",
    "render_svg",
    "write_timeline",
]

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


def _emulation_note(result: SimResult, cluster: Cluster | None) -> str:
    """``; EMULATED device speeds: cpu-slow (emulated: cpu 3x slower)`` when a device is emulated."""
    if cluster is None:
        return ""
    labels = dict.fromkeys(cluster.device(a).type.label() for a in result.devices if cluster.device(a).type.emulated)
    return f"; EMULATED device speeds: {', '.join(labels)}" if labels else ""


def layout(
    result: SimResult, *, title: str = "", width: int = 1200, row_height: int = 22, cluster: Cluster | None = None
) -> Layout:
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
            f"iteration {total * 1e3:.3f} ms, bubble {result.bubble_fraction:.1%}, bottleneck: {result.bottleneck}"
            + _emulation_note(result, cluster),
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


def render_svg(
    result: SimResult, *, title: str = "", width: int = 1200, row_height: int = 22, cluster: Cluster | None = None
) -> str:
    """The timeline as SVG text (self-contained, readable in any browser)."""
    picture = layout(result, title=title, width=width, row_height=row_height, cluster=cluster)
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


def render_png(
    result: SimResult, *, title: str = "", width: int = 1200, row_height: int = 22, cluster: Cluster | None = None
) -> bytes:
    """The same picture as :func:`render_svg`, as PNG bytes (needs matplotlib: ``hetplan[png]``)."""
    from hetplan.simulate.png import render_png as rasterise

    return rasterise(layout(result, title=title, width=width, row_height=row_height, cluster=cluster))


def check_timeline_path(path: str | Path) -> None:
    """Refuse, before any work, a timeline file this module cannot write: an unknown suffix, or a
    PNG without matplotlib."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".svg", ".png"):
        raise HetplanError(
            f"unsupported timeline format {Path(path).suffix!r}; use a .svg or .png file (or --trace FILE.json "
            "for Perfetto)",
            field="--timeline",
        )
    if suffix == ".png":
        from hetplan.simulate.png import require_matplotlib

        require_matplotlib()


def write_timeline(result: SimResult, path: str | Path, *, title: str = "", cluster: Cluster | None = None) -> None:
    """Write the timeline as ``.svg`` or ``.png`` (by the file's suffix; PNG needs matplotlib)."""
    check_timeline_path(path)
    target = Path(path)
    if target.suffix.lower() == ".svg":
        data = render_svg(result, title=title, cluster=cluster).encode("utf-8")
    else:
        data = render_png(result, title=title, cluster=cluster)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
