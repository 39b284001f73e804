"""Rasterise simple drawings and encode them as PNG, with numpy and the standard library alone.

    canvas = Canvas(400, 120)
    canvas.rect(10, 10, 200, 20, "#4C78A8")
    canvas.text(10, 60, "time (ms) 0.5 / 1.0", scale=1)      # y is the text's baseline, as in SVG
    canvas.line(10, 80, 390, 80, "#000000")
    Path("x.png").write_bytes(canvas.to_png())

Text uses an embedded 5x7 bitmap font (digits, both cases of the latin letters and common
punctuation; anything else draws as ``?``), in cells of 6x8 pixels times ``scale``. PNG encoding is
the minimal valid file: signature, ``IHDR`` (8-bit RGB, no interlace), one ``IDAT`` holding the
zlib-compressed rows (each with filter byte 0), ``IEND``; each chunk with its CRC-32 (RFC 2083).
The output is deterministic: the same drawing gives the same bytes.
"""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np

__all__ = ["GLYPH_HEIGHT", "GLYPH_WIDTH", "Canvas", "encode_png", "parse_colour", "text_width"]

GLYPH_WIDTH, GLYPH_HEIGHT = 5, 7  # pixels of one glyph; cells are one pixel wider and taller
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Rows top to bottom, 5 bits each (16 = leftmost pixel), after the HD44780 LCD character ROM
# (lower-case descenders are raised into the 7 rows).
_FONT_ROWS = {
    " ": "00 00 00 00 00 00 00",
    "0": "0E 11 13 15 19 11 0E",
    "1": "04 0C 04 04 04 04 0E",
    "2": "0E 11 01 02 04 08 1F",
    "3": "1F 02 04 02 01 11 0E",
    "4": "02 06 0A 12 1F 02 02",
    "5": "1F 10 1E 01 01 11 0E",
    "6": "06 08 10 1E 11 11 0E",
    "7": "1F 01 02 04 08 08 08",
    "8": "0E 11 11 0E 11 11 0E",
    "9": "0E 11 11 0F 01 02 0C",
    "A": "0E 11 11 11 1F 11 11",
    "B": "1E 11 11 1E 11 11 1E",
    "C": "0E 11 10 10 10 11 0E",
    "D": "1C 12 11 11 11 12 1C",
    "E": "1F 10 10 1E 10 10 1F",
    "F": "1F 10 10 1E 10 10 10",
    "G": "0E 11 10 17 11 11 0F",
    "H": "11 11 11 1F 11 11 11",
    "I": "0E 04 04 04 04 04 0E",
    "J": "07 02 02 02 02 12 0C",
    "K": "11 12 14 18 14 12 11",
    "L": "10 10 10 10 10 10 1F",
    "M": "11 1B 15 15 11 11 11",
    "N": "11 11 19 15 13 11 11",
    "O": "0E 11 11 11 11 11 0E",
    "P": "1E 11 11 1E 10 10 10",
    "Q": "0E 11 11 11 15 12 0D",
    "R": "1E 11 11 1E 14 12 11",
    "S": "0F 10 10 0E 01 01 1E",
    "T": "1F 04 04 04 04 04 04",
    "U": "11 11 11 11 11 11 0E",
    "V": "11 11 11 11 11 0A 04",
    "W": "11 11 11 15 15 15 0A",
    "X": "11 11 0A 04 0A 11 11",
    "Y": "11 11 11 0A 04 04 04",
    "Z": "1F 01 02 04 08 10 1F",
    "a": "00 00 0E 01 0F 11 0F",
    "b": "10 10 16 19 11 11 1E",
    "c": "00 00 0E 10 10 11 0E",
    "d": "01 01 0D 13 11 11 0F",
    "e": "00 00 0E 11 1F 10 0E",
    "f": "06 09 08 1C 08 08 08",
    "g": "00 00 0F 11 0F 01 0E",
    "h": "10 10 16 19 11 11 11",
    "i": "04 00 0C 04 04 04 0E",
    "j": "02 00 06 02 02 12 0C",
    "k": "10 10 12 14 18 14 12",
    "l": "0C 04 04 04 04 04 0E",
    "m": "00 00 1A 15 15 11 11",
    "n": "00 00 16 19 11 11 11",
    "o": "00 00 0E 11 11 11 0E",
    "p": "00 00 1E 11 1E 10 10",
    "q": "00 00 0D 13 0F 01 01",
    "r": "00 00 16 19 10 10 10",
    "s": "00 00 0E 10 0E 01 1E",
    "t": "08 08 1C 08 08 09 06",
    "u": "00 00 11 11 11 13 0D",
    "v": "00 00 11 11 11 0A 04",
    "w": "00 00 11 11 15 15 0A",
    "x": "00 00 11 0A 04 0A 11",
    "y": "00 00 11 11 0F 01 0E",
    "z": "00 00 1F 02 04 08 1F",
    ".": "00 00 00 00 00 0C 0C",
    ",": "00 00 00 00 0C 04 08",
    "/": "00 01 02 04 08 10 00",
    "\\": "00 10 08 04 02 01 00",
    "-": "00 00 00 1F 00 00 00",
    "+": "00 04 04 1F 04 04 00",
    "=": "00 00 1F 00 1F 00 00",
    "_": "00 00 00 00 00 00 1F",
    ":": "00 0C 0C 00 0C 0C 00",
    ";": "00 0C 0C 00 0C 04 08",
    "%": "18 19 02 04 08 13 03",
    "(": "02 04 08 08 08 04 02",
    ")": "08 04 02 02 02 04 08",
    "[": "0E 08 08 08 08 08 0E",
    "]": "0E 02 02 02 02 02 0E",
    "<": "02 04 08 10 08 04 02",
    ">": "08 04 02 01 02 04 08",
    "#": "0A 0A 1F 0A 1F 0A 0A",
    "*": "00 04 15 0E 15 04 00",
    "'": "0C 04 08 00 00 00 00",
    '"': "0A 0A 0A 00 00 00 00",
    "!": "04 04 04 04 04 00 04",
    "?": "0E 11 01 02 04 00 04",
    "@": "0E 11 17 15 17 10 0E",
    "&": "0C 12 14 08 15 12 0D",
    "|": "04 04 04 04 04 04 04",
}


def _glyph(rows: str) -> np.ndarray:
    bits = [int(r, 16) for r in rows.split()]
    return np.array([[(b >> (GLYPH_WIDTH - 1 - c)) & 1 for c in range(GLYPH_WIDTH)] for b in bits], dtype=bool)


FONT: dict[str, np.ndarray] = {ch: _glyph(rows) for ch, rows in _FONT_ROWS.items()}


def _snap(v: float) -> int:
    """The pixel edge nearest ``v`` (halves round up, so equal spans snap alike everywhere)."""
    return math.floor(v + 0.5)


def text_width(text: str, *, scale: int = 1) -> int:
    """Pixels ``text`` spans: 6 per character (5 and a gap), less the last gap."""
    return max(0, (GLYPH_WIDTH + 1) * len(text) - 1) * scale


def parse_colour(colour: str | tuple[int, int, int]) -> tuple[int, int, int]:
    """``"#4C78A8"`` (or ``"white"``/``"black"``, or an RGB tuple) as an RGB tuple."""
    if isinstance(colour, tuple):
        return colour
    named = {"white": "#FFFFFF", "black": "#000000"}
    value = named.get(colour, colour).lstrip("#")
    return int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16)


class Canvas:
    """An RGB image (white) that rectangles, lines and bitmap text are drawn on, in pixel units.

    Coordinates are floats as in SVG: a rectangle covers the pixels whose left/top edge lies in
    ``[snap(x), snap(x + w))`` (at least one pixel; halves round up), so adjacent rectangles neither overlap nor
    leave gaps.
    """

    def __init__(self, width: int, height: int, *, background: str = "#FFFFFF") -> None:
        self.width, self.height = int(width), int(height)
        self.pixels = np.empty((self.height, self.width, 3), dtype=np.uint8)
        self.pixels[:, :] = parse_colour(background)
        self._colours: dict[str | tuple[int, int, int], np.ndarray] = {}

    def rect(self, x: float, y: float, w: float, h: float, colour: str | tuple[int, int, int]) -> None:
        floor = math.floor
        x0, y0 = floor(x + 0.5), floor(y + 0.5)  # _snap, inlined: timelines draw 10^5 bars
        x1, y1 = floor(x + w + 0.5), floor(y + h + 0.5)
        if x1 <= x0:
            x1 = x0 + 1
        if y1 <= y0:
            y1 = y0 + 1
        rgb = self._colours.get(colour)
        if rgb is None:
            rgb = self._colours[colour] = np.array(parse_colour(colour), dtype=np.uint8)
        self.pixels[max(y0, 0) : min(y1, self.height), max(x0, 0) : min(x1, self.width)] = rgb

    def line(self, x1: float, y1: float, x2: float, y2: float, colour: str | tuple[int, int, int] = "#000000") -> None:
        """A one-pixel line (sampled at every pixel step along its longer axis)."""
        steps = int(max(abs(x2 - x1), abs(y2 - y1))) + 1
        xs = np.rint(np.linspace(x1, x2, steps)).astype(int)
        ys = np.rint(np.linspace(y1, y2, steps)).astype(int)
        keep = (xs >= 0) & (xs < self.width) & (ys >= 0) & (ys < self.height)
        self.pixels[ys[keep], xs[keep]] = parse_colour(colour)

    def text(
        self,
        x: float,
        y: float,
        text: str,
        *,
        colour: str | tuple[int, int, int] = "#000000",
        scale: int = 1,
        anchor: str = "start",
        bold: bool = False,
    ) -> None:
        """``text`` with its baseline at ``y``; ``anchor`` is ``start``, ``middle`` or ``end`` of ``x``
        (as SVG's ``text-anchor``); ``bold`` draws each glyph twice, one pixel apart."""
        width = text_width(text, scale=scale) + (1 if bold else 0)
        left = _snap(x - {"start": 0, "middle": width / 2, "end": width}[anchor])
        top = _snap(y) - GLYPH_HEIGHT * scale
        rgb = parse_colour(colour)
        for i, ch in enumerate(text):
            glyph = FONT.get(ch, FONT["?"])
            if scale > 1:
                glyph = np.kron(glyph, np.ones((scale, scale), dtype=bool))
            gx = left + i * (GLYPH_WIDTH + 1) * scale
            for dx in (0, 1) if bold else (0,):
                self._stamp(glyph, gx + dx, top, rgb)

    def _stamp(self, mask: np.ndarray, x: int, y: int, rgb: tuple[int, int, int]) -> None:
        h, w = mask.shape
        x0, y0 = max(x, 0), max(y, 0)
        x1, y1 = min(x + w, self.width), min(y + h, self.height)
        if x1 <= x0 or y1 <= y0:
            return
        region = self.pixels[y0:y1, x0:x1]
        region[mask[y0 - y : y1 - y, x0 - x : x1 - x]] = rgb

    def to_png(self) -> bytes:
        return encode_png(self.pixels)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def encode_png(pixels: np.ndarray, *, level: int = 6) -> bytes:
    """PNG bytes of an ``(height, width, 3)`` uint8 RGB array."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
        raise ValueError(f"expected an (height, width, 3) uint8 array, got {pixels.shape} {pixels.dtype}")
    height, width, _ = pixels.shape
    raw = np.zeros((height, 1 + 3 * width), dtype=np.uint8)  # each row: filter type 0, then RGB
    raw[:, 1:] = pixels.reshape(height, 3 * width)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit, RGB, deflate, no interlace
    return (
        PNG_SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw.tobytes(), level))
        + _chunk(b"IEND", b"")
    )
