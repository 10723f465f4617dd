"""A loss-curve PNG without a plotting library: lines drawn into a pixel grid, then zlib.

The picture holds the axes, a faint grid at every whole nat of loss, the training
loss in blue and the validation loss in orange; the numbers go in the training log.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

WIDTH, HEIGHT, MARGIN = 640, 400, 30
WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (225, 225, 225)
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)

Point = tuple[float, float]  # (step, loss)


def write_loss_plot(path: Path, train: Sequence[Point], validation: Sequence[Point]) -> None:
    """Draw both curves (step on x, loss on y, y from 0) and save them as a PNG file."""
    pixels = [[WHITE] * WIDTH for _ in range(HEIGHT)]
    points = [*train, *validation]
    max_step = max((step for step, _ in points), default=1) or 1
    max_loss = math.ceil(max((loss for _, loss in points), default=1.0)) or 1

    def place(point: Point) -> tuple[int, int]:
        step, loss = point
        x = MARGIN + round(step / max_step * (WIDTH - 2 * MARGIN))
        y = HEIGHT - MARGIN - round(min(loss, max_loss) / max_loss * (HEIGHT - 2 * MARGIN))
        return x, y

    for whole in range(1, max_loss + 1):
        _line(pixels, place((0, whole)), place((max_step, whole)), GREY)
    _line(pixels, place((0, 0)), place((max_step, 0)), BLACK)
    _line(pixels, place((0, 0)), place((0, max_loss)), BLACK)
    for series, colour in ((train, BLUE), (validation, ORANGE)):
        placed = [place(point) for point in series]
        for start, end in zip(placed, placed[1:]):
            _line(pixels, start, end, colour)
        if len(placed) == 1:  # a lone point still shows
            x, y = placed[0]
            _line(pixels, (x - 2, y), (x + 2, y), colour)
    path.write_bytes(encode_png(pixels))


def _line(pixels: list[list[tuple[int, int, int]]], start: tuple[int, int], end: tuple[int, int],
          colour: tuple[int, int, int]) -> None:
    """Bresenham's line, two pixels thick so it reads at a glance."""
    (x0, y0), (x1, y1) = start, end
    dx, dy = abs(x1 - x0), -abs(y1 - y0)
    sx, sy = (1 if x1 >= x0 else -1), (1 if y1 >= y0 else -1)
    error = dx + dy
    while True:
        for x, y in ((x0, y0), (x0, y0 - 1)):
            if 0 <= x < WIDTH and 0 <= y < HEIGHT:
                pixels[y][x] = colour
        if (x0, y0) == (x1, y1):
            return
        doubled = 2 * error
        if doubled >= dy:
            error, x0 = error + dy, x0 + sx
        if doubled <= dx:
            error, y0 = error + dx, y0 + sy


def encode_png(pixels: list[list[tuple[int, int, int]]]) -> bytes:
    """An 8-bit RGB PNG of the rows (each row starts with filter byte 0: none)."""
    height, width = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(channel for pixel in row for channel in pixel) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
