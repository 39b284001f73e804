"""PNG timelines without dependencies: a valid file that decodes to the picture drawn."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from builders import make_cluster, make_profile

from planner.contracts.plan import Pipeline, Plan, Stage
from planner.simulate import simulate
from planner.simulate.png import FONT, Canvas, encode_png, parse_colour, text_width
from planner.simulate.timeline import COLOURS, bar_box, layout, render_png

A100 = "A100-80GB"


def _decode(data: bytes) -> tuple[dict[bytes, bytes], np.ndarray]:
    """Chunks (checking every CRC) and the RGB pixels of a PNG written by :func:`encode_png`."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks: dict[bytes, bytes] = {}
    order, idat, pos = [], b"", 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        order.append(kind)
        chunks[kind] = body
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    assert order[0] == b"IHDR" and order[-1] == b"IEND" and b"IDAT" in order
    width, height, depth, colour_type, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, colour_type, compression, filtering, interlace) == (8, 2, 0, 0, 0)
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8)
    assert raw.size == height * (1 + 3 * width)
    rows = raw.reshape(height, 1 + 3 * width)
    assert not rows[:, 0].any()  # filter type 0 on every row
    return chunks, rows[:, 1:].reshape(height, width, 3)


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


def test_png_is_valid_and_has_the_layout_size() -> None:
    result = _result()
    chunks, pixels = _decode(render_png(result))
    picture = layout(result)
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    assert (width, height) == (picture.width, picture.height) == (1200, 50 + 22 * 4 + 60)
    assert pixels.shape == (height, width, 3)


@pytest.mark.parametrize("kind", ["F", "B"])
def test_the_pixel_under_a_compute_bar_has_its_kind_colour(kind: str) -> None:
    result = _result()
    _, pixels = _decode(render_png(result))
    rows = list(result.devices)
    row, _, lo, hi, _ = max((t for t in result.timeline if t[1] == kind), key=lambda t: t[3] - t[2])
    x, y, w, h = bar_box(rows.index(row), kind, lo, hi, scale=(1200 - 230 - 20) / result.iteration_s)
    assert w > 10  # wide enough that its middle is well inside
    assert tuple(pixels[int(y + h / 2), int(x + w / 2)]) == parse_colour(COLOURS[kind])


def test_text_is_drawn_and_the_picture_is_deterministic() -> None:
    result = _result()
    png = render_png(result, title="T")
    assert png == render_png(result, title="T")
    _, pixels = _decode(png)
    label_band = pixels[50 : 50 + 22, :224]  # the first row's label, right-aligned before the plot
    assert (label_band == 0).all(axis=2).any()  # black text pixels
    legend = pixels[-16:, 230:]
    for colour in COLOURS.values():
        assert (legend == parse_colour(colour)).all(axis=2).any()


def test_canvas_text_anchors_and_unknown_characters() -> None:
    canvas = Canvas(100, 20)
    canvas.text(50, 10, "ab", anchor="middle")
    drawn = np.flatnonzero((canvas.pixels != 255).any(axis=(0, 2)))
    assert drawn.min() >= 50 - text_width("ab") // 2 - 1 and drawn.max() <= 50 + text_width("ab") // 2 + 1
    other = Canvas(20, 10)
    other.text(0, 8, "\u00e9")  # no glyph: drawn as "?"
    reference = Canvas(20, 10)
    reference.text(0, 8, "?")
    assert (other.pixels == reference.pixels).all()
    assert {"0", "9", "a", "z", "A", "Z", ".", "/", "-", ":", "%", "(", ")", " "} <= set(FONT)


def test_encode_png_round_trips_pixels_and_rejects_other_arrays() -> None:
    pixels = np.arange(4 * 3 * 3, dtype=np.uint8).reshape(4, 3, 3)
    _, decoded = _decode(encode_png(pixels))
    assert (decoded == pixels).all()
    with pytest.raises(ValueError, match="uint8"):
        encode_png(pixels.astype(np.float32))
