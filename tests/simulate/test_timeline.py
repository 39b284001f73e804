"""The timeline picture: one bar per task, coloured by kind, with legend and axis; deterministic."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from builders import make_cluster, make_profile

from hetplan.contracts.cluster import load_cluster
from hetplan.contracts.paths import bundled_profiles_dir
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.errors import HetplanError
from hetplan.simulate import simulate
from hetplan.simulate.timeline import COLOURS, LEGEND, layout, render_svg, write_timeline

A100, V100 = "A100-80GB", "V100-16GB"


def _result(timeline: bool = True):
    """Two pipelines of two stages over two nodes: forwards, backwards, transfers, all-reduces, steps."""
    profile = make_profile(4, times={A100: (0.01, 0.02), V100: (0.02, 0.04)}, params=1_000_000, output_bytes=1e6)
    cluster = make_cluster([("n0", [(A100, 2)]), ("n1", [(V100, 2)])], inter="10GB/s", inter_latency="10us")
    plan = Plan(
        global_batch=8,
        pipelines=[
            Pipeline(4, (1, 1, 2), (Stage(0, 2, ("n0/0",), (1.0,)), Stage(2, 4, ("n1/0",), (1.0,)))),
            Pipeline(4, (2, 2), (Stage(0, 2, ("n1/1",), (1.0,)), Stage(2, 4, ("n0/1",), (1.0,)))),
        ],
        optimizer="adam",
    )
    return simulate(plan, profile, cluster, timeline=timeline)


def _task_rects(svg: str) -> list[str]:
    return re.findall(r'<rect [^>]*stroke="white"[^>]*><title>[^<]*</title></rect>', svg)


def test_svg_has_one_rect_per_timeline_task_in_its_kind_colour() -> None:
    result = _result()
    svg = render_svg(result)
    rects = _task_rects(svg)
    assert len(rects) == len(result.timeline)
    kinds = {kind for _, kind, *_ in result.timeline}
    assert kinds == set(COLOURS)  # the fixture exercises every kind
    for kind, colour in COLOURS.items():
        drawn = sum(f'fill="{colour}"' in r for r in rects)
        assert drawn == sum(k == kind for _, k, *_ in result.timeline), kind


def test_svg_is_well_formed_with_a_legend_of_every_kind_and_an_axis_label() -> None:
    svg = render_svg(_result(), title="a & b <test>")
    root = ET.fromstring(svg)  # well-formed XML, title escaped
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "a & b <test>" in texts
    assert "time (ms)" in texts
    for kind, name in LEGEND.items():
        assert name in texts
        assert f'width="12" height="10" fill="{COLOURS[kind]}"' in svg  # its swatch
    assert texts.count("0") == 1  # the axis starts at 0 ms


def test_svg_is_identical_for_two_runs() -> None:
    assert render_svg(_result(), title="t") == render_svg(_result(), title="t")


def test_bars_lie_inside_the_plot_and_rows_match_devices() -> None:
    result = _result()
    picture = layout(result)
    assert picture.height == 50 + 22 * len(result.devices) + 60
    for shape in picture.shapes:
        if getattr(shape, "tooltip", ""):
            assert shape.x >= 230 - 1e-9
            assert shape.x + shape.w <= picture.width - 20 + 0.5 + 1e-9


def test_write_timeline_picks_the_format_by_suffix(tmp_path) -> None:
    result = _result()
    write_timeline(result, tmp_path / "sub" / "t.svg")
    assert (tmp_path / "sub" / "t.svg").read_text(encoding="utf-8") == render_svg(result)
    with pytest.raises(HetplanError, match=r"use a \.svg or \.png file"):
        write_timeline(result, tmp_path / "t.pdf")
    assert not (tmp_path / "t.pdf").exists()  # PNG: tests/simulate/test_png.py


def test_emulated_device_speeds_are_said_in_the_subtitle() -> None:
    profile = make_profile(4, times={"cpu": (0.01, 0.02)}, params=1000, output_bytes=1000)
    cluster = load_cluster(bundled_profiles_dir() / "clusters" / "local-2.yaml")
    stages = (Stage(0, 2, ("local/0",), (1.0,)), Stage(2, 4, ("local/1",), (1.0,)))
    plan = Plan(global_batch=4, pipelines=[Pipeline(4, (2, 2), stages)], optimizer="sgd")
    result = simulate(plan, profile, cluster, timeline=True)
    texts = [
        t.text for t in ET.fromstring(render_svg(result, cluster=cluster)).iter("{http://www.w3.org/2000/svg}text")
    ]
    subtitle = next(t for t in texts if t.startswith("iteration "))
    assert "EMULATED device speeds: " in subtitle and "cpu-slow (emulated: cpu 3x slower)" in subtitle
    assert not any("EMULATED" in (t or "") for t in [s.text for s in layout(result).shapes if hasattr(s, "text")])


def test_a_result_without_a_timeline_is_an_error() -> None:
    with pytest.raises(HetplanError, match="timeline=True"):
        render_svg(_result(timeline=False))
