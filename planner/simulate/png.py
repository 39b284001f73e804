"""Rasterise a timeline layout to PNG with matplotlib (an optional extra: ``pip install 'hetplan[png]'``).

    picture = layout(result)                    # hetplan.simulate.timeline: shapes in pixels
    Path("plan.png").write_bytes(render_png(picture))

The layout the SVG is written from is drawn shape by shape on a figure of exactly its pixel size
(100 dpi, one axes over the whole figure, y pointing down as in SVG), so the two pictures agree.
Bars go into one ``PolyCollection`` (a timeline may have 10^5 of them), lines into one
``LineCollection``; text uses matplotlib's bundled DejaVu Sans. The object-oriented API with the Agg
canvas is used, not ``pyplot``: no global state, no GUI backend. The PNG carries no ``Software``
stamp, so the same picture and matplotlib version give the same bytes.

matplotlib is imported only when a PNG is asked for; without it the error says how to install it
(SVG timelines and Chrome traces need nothing beyond hetplan's own dependencies).
"""

from __future__ import annotations

import io
from typing import Any

from hetplan.errors import HetplanError

__all__ = ["INSTALL_HINT", "render_png", "require_matplotlib"]

INSTALL_HINT = "PNG timelines need matplotlib: pip install 'hetplan[png]' (or write the timeline as .svg)"
DPI = 100
_ANCHOR = {"start": "left", "middle": "center", "end": "right"}


def require_matplotlib() -> Any:
    """The pieces of matplotlib used here, or the one-line install hint."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import LineCollection, PolyCollection
        from matplotlib.figure import Figure
    except ImportError:
        raise HetplanError(INSTALL_HINT, field="--timeline") from None
    return FigureCanvasAgg, Figure, LineCollection, PolyCollection


def render_png(picture: Any) -> bytes:
    """PNG bytes (RGBA, the layout's width x height pixels) of a :class:`hetplan.simulate.timeline.Layout`."""
    from hetplan.simulate.timeline import Line, Rect

    canvas_type, figure_type, line_collection, poly_collection = require_matplotlib()
    figure = figure_type(figsize=(picture.width / DPI, picture.height / DPI), dpi=DPI)
    canvas_type(figure)
    axes = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    axes.set_xlim(0, picture.width)
    axes.set_ylim(picture.height, 0)  # y down, as in SVG
    axes.set_axis_off()
    pt = 72.0 / DPI  # one pixel in points

    # Shapes are drawn in layout order: each collection is one layer, and the layout puts the
    # background and row stripes before the bars, so z-order by kind keeps the same stacking.
    plain, bars, lines = [], [], []
    for s in picture.shapes:
        if isinstance(s, Rect):
            (bars if s.tooltip else plain).append(s)
        elif isinstance(s, Line):
            lines.append(s)

    def polygons(rects: list) -> list:
        return [[(r.x, r.y), (r.x + r.w, r.y), (r.x + r.w, r.y + r.h), (r.x, r.y + r.h)] for r in rects]

    if plain:
        axes.add_collection(
            poly_collection(polygons(plain), facecolors=[r.fill for r in plain], linewidths=0, antialiased=False)
        )
    if bars:  # the SVG's white hairline between neighbouring bars
        axes.add_collection(
            poly_collection(
                polygons(bars),
                facecolors=[r.fill for r in bars],
                edgecolors="white",
                linewidths=0.3 * pt,
                antialiased=False,
            )
        )
    if lines:
        axes.add_collection(
            line_collection([[(ln.x1, ln.y1), (ln.x2, ln.y2)] for ln in lines], colors="black", linewidths=pt)
        )
    for s in picture.shapes:
        if isinstance(s, (Rect, Line)):
            continue
        axes.text(
            s.x,
            s.y,
            s.text,
            ha=_ANCHOR[s.anchor],
            va="baseline",
            fontsize=s.size * pt,
            fontweight="bold" if s.bold else "normal",
            family="DejaVu Sans",
        )
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=DPI, metadata={"Software": None})
    return out.getvalue()
