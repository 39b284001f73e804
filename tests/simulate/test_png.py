"""PNG timelines through matplotlib, an optional extra: the picture the SVG draws, or one line
saying how to install it."""

from __future__ import annotations

import io
import struct
import sys
from pathlib import Path

import pytest
import yaml
from builders import make_cluster, make_profile

from hetplan.cli import main
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.errors import HetplanError
from hetplan.simulate import simulate
from hetplan.simulate.png import INSTALL_HINT
from hetplan.simulate.timeline import COLOURS, bar_box, layout, render_png, write_timeline

A100 = "A100-80GB"


def _result():
    profile = make_profile(4, times={A100: (0.01, 0.02)}, params=1_000_000, output_bytes=1e6)
    cluster = make_cluster([("n0", [(A100, 2)]), ("n1", [(A100, 2)])], inter="10GB/s")
    plan = Plan(
        global_batch=8,
        pipelines=[
            Pipeline(4, (2, 2), (Stage(0, 2, ("n0/0",), (1.0,)), Stage(2, 4, ("n1/0",), (1.0,)))),
            Pipeline(4, (2, 2), (Stage(0, 2, ("n0/1",), (1.0,)), Stage(2, 4, ("n1/1",), (1.0,)))),
        ],
        optimizer="sgd",
    )
    return simulate(plan, profile, cluster, timeline=True)


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib as if not installed (an import of it or any of its modules fails)."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_without_matplotlib_a_png_is_one_line_saying_how_to_install_it(no_matplotlib, tmp_path: Path) -> None:
    with pytest.raises(HetplanError, match=r"pip install 'hetplan\[png\]'"):
        render_png(_result())
    with pytest.raises(HetplanError) as info:
        write_timeline(_result(), tmp_path / "sub" / "t.png")
    assert str(info.value) == f"--timeline: {INSTALL_HINT}"
    assert not (tmp_path / "sub").exists()  # refused before anything is written
    write_timeline(_result(), tmp_path / "t.svg")  # SVG needs nothing extra
    assert (tmp_path / "t.svg").read_text(encoding="utf-8").startswith("<svg")


def test_the_cli_refuses_a_png_timeline_without_matplotlib_before_simulating(
    no_matplotlib, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = make_profile(2, times={"cpu": (0.001, 0.002)})
    profile.save(tmp_path / "profile.yaml")
    from hetplan.contracts.paths import bundled_profiles_dir

    plan = {
        "schema": "hetplan/plan/v1",
        "inputs": {
            "profile": {"path": "profile.yaml"},
            "cluster": {"path": str(bundled_profiles_dir() / "clusters" / "local-2.yaml")},
        },
        "global_batch": 2,
        "pipelines": [{"batch": 2, "micro_batches": [2], "stages": [{"blocks": [0, 2], "devices": ["local/0"]}]}],
    }
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    with pytest.raises(SystemExit) as info:
        main(["simulate", str(tmp_path / "plan.yaml"), "--timeline", str(tmp_path / "t.png")])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == ""
    assert err == f"error: --timeline: {INSTALL_HINT}\n"
    assert not (tmp_path / "t.png").exists()


def _decode(png: bytes):
    """(width, height) from the header, and the pixels as matplotlib reads them (floats in [0, 1])."""
    image = pytest.importorskip("matplotlib.image")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    return (width, height), image.imread(io.BytesIO(png), format="png")


def _rgb(colour: str) -> tuple[int, int, int]:
    value = colour.lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16)


def test_png_has_the_layout_size_and_is_deterministic() -> None:
    pytest.importorskip("matplotlib")
    result = _result()
    png = render_png(result, title="T")
    size, pixels = _decode(png)
    picture = layout(result)
    assert size == (picture.width, picture.height) == (1200, 50 + 22 * 4 + 60)
    assert pixels.shape[:2] == (picture.height, picture.width)
    assert png == render_png(result, title="T")


@pytest.mark.parametrize("kind", ["F", "B"])
def test_the_pixel_under_a_compute_bar_has_its_kind_colour(kind: str) -> None:
    pytest.importorskip("matplotlib")
    result = _result()
    _, pixels = _decode(render_png(result))
    rows = list(result.devices)
    row, _, lo, hi, _ = max((t for t in result.timeline if t[1] == kind), key=lambda t: t[3] - t[2])
    x, y, w, h = bar_box(rows.index(row), kind, lo, hi, scale=(1200 - 230 - 20) / result.iteration_s)
    assert w > 10  # wide enough that its middle is well inside
    r, g, b = (round(float(c) * 255) for c in pixels[int(y + h / 2), int(x + w / 2)][:3])
    assert (r, g, b) == _rgb(COLOURS[kind])


def test_text_and_every_legend_colour_are_drawn() -> None:
    pytest.importorskip("matplotlib")
    _, pixels = _decode(render_png(_result(), title="T"))
    rgb = (pixels[..., :3] * 255).round().astype(int)
    label_band = rgb[50 : 50 + 22, :224]  # the first row's label, right-aligned before the plot
    assert (label_band.sum(axis=2) < 200).any()  # dark text pixels
    legend = rgb[-16:, 230:]
    for colour in COLOURS.values():
        assert (legend == _rgb(colour)).all(axis=2).any(), colour
