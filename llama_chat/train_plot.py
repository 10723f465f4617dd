"""A loss-curve PNG without a plotting library: lines and text drawn into a pixel grid, then zlib.

The picture holds the axes, a faint grid with a label at every whole nat of loss, the
first and last step under the x axis, the training loss in blue and the validation loss
in orange, and a legend naming them.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 48, 20, 36, 40  # margins: room for the labels
WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (225, 225, 225)
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)
SCALE = 2  # each font pixel is drawn as a SCALE x SCALE square

Point = tuple[float, float]  # (step, loss)
Pixels = list[list[tuple[int, int, int]]]

# A 5x7 pixel font with just the characters the labels use.
FONT = {
    "0": (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    "1": ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "2": (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    "3": ("####.", "....#", "....#", ".###.", "....#", "....#", "####."),
    "4": ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    "5": ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    "6": (".###.", "#....", "#....", "####.", "#...#", "#...#", ".###."),
    "7": ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    "8": (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    "9": (".###.", "#...#", "#...#", ".####", "....#", "....#", ".###."),
    "a": (".....", ".....", ".###.", "....#", ".####", "#...#", ".####"),
    "d": ("....#", "....#", ".##.#", "#..##", "#...#", "#...#", ".####"),
    "e": (".....", ".....", ".###.", "#...#", "#####", "#....", ".###."),
    "i": ("..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###."),
    "l": (".##..", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "n": (".....", ".....", "#.##.", "##..#", "#...#", "#...#", "#...#"),
    "o": (".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###."),
    "p": (".....", ".....", "####.", "#...#", "####.", "#....", "#...."),
    "r": (".....", ".....", "#.##.", "##..#", "#....", "#....", "#...."),
    "s": (".....", ".....", ".####", "#....", ".###.", "....#", "####."),
    "t": (".#...", ".#...", "###..", ".#...", ".#...", ".#..#", "..##."),
    "v": (".....", ".....", "#...#", "#...#", "#...#", ".#.#.", "..#.."),
}
CHAR_WIDTH, CHAR_HEIGHT = 6 * SCALE, 7 * SCALE  # a glyph and one column of space


def write_loss_plot(path: Path, train: Sequence[Point], validation: Sequence[Point]) -> None:
    """Draw both curves (step on x, loss on y, y from 0) and save them as a PNG file."""
    pixels: Pixels = [[WHITE] * WIDTH for _ in range(HEIGHT)]
    # A run that diverged has nan or inf losses: they have no place on the scale.
    train = [point for point in train if math.isfinite(point[1])]
    validation = [point for point in validation if math.isfinite(point[1])]
    points = [*train, *validation]
    max_step = max((step for step, _ in points), default=1) or 1
    max_loss = math.ceil(max((loss for _, loss in points), default=1.0)) or 1

    def place(point: Point) -> tuple[int, int]:
        step, loss = point
        x = LEFT + round(step / max_step * (WIDTH - LEFT - RIGHT))
        y = HEIGHT - BOTTOM - round(min(loss, max_loss) / max_loss * (HEIGHT - TOP - BOTTOM))
        return x, y

    label_every = math.ceil(max_loss / 10)  # at most about ten labels up the y axis
    for whole in range(0, max_loss + 1):
        if whole:
            _line(pixels, place((0, whole)), place((max_step, whole)), GREY)
        if whole % label_every == 0:
            x, y = place((0, whole))
            _text(pixels, x - 6 - text_width(str(whole)), y - CHAR_HEIGHT // 2, str(whole), BLACK)
    _line(pixels, place((0, 0)), place((max_step, 0)), BLACK)
    _line(pixels, place((0, 0)), place((0, max_loss)), BLACK)
    below_axis = HEIGHT - BOTTOM + 8
    _text(pixels, LEFT - CHAR_WIDTH // 2, below_axis, "0", BLACK)
    last = str(round(max_step))
    _text(pixels, WIDTH - RIGHT - text_width(last), below_axis, last, BLACK)
    _text(pixels, (WIDTH - text_width("step")) // 2, below_axis, "step", BLACK)
    _text(pixels, 8, 10, "loss", BLACK)
    _legend(pixels, [("train", BLUE), ("validation", ORANGE)])
    for series, colour in ((train, BLUE), (validation, ORANGE)):
        placed = [place(point) for point in series]
        for start, end in zip(placed, placed[1:]):
            _line(pixels, start, end, colour)
        if len(placed) == 1:  # a lone point still shows
            x, y = placed[0]
            _line(pixels, (x - 2, y), (x + 2, y), colour)
    path.write_bytes(encode_png(pixels))


def text_width(text: str) -> int:
    return len(text) * CHAR_WIDTH - SCALE  # no space after the last glyph


def _text(pixels: Pixels, left: int, top: int, text: str, colour: tuple[int, int, int]) -> None:
    for index, char in enumerate(text):
        for row, bits in enumerate(FONT[char]):
            for column, bit in enumerate(bits):
                if bit == "#":
                    x, y = left + index * CHAR_WIDTH + column * SCALE, top + row * SCALE
                    for dy in range(SCALE):
                        for dx in range(SCALE):
                            if 0 <= x + dx < WIDTH and 0 <= y + dy < HEIGHT:
                                pixels[y + dy][x + dx] = colour


def _legend(pixels: Pixels, entries: list[tuple[str, tuple[int, int, int]]]) -> None:
    """Each name after a short line of its colour, side by side at the top right."""
    right = WIDTH - RIGHT
    for name, colour in reversed(entries):
        left = right - text_width(name)
        _text(pixels, left, 10, name, colour)
        _line(pixels, (left - 26, 10 + CHAR_HEIGHT // 2), (left - 6, 10 + CHAR_HEIGHT // 2), colour)
        right = left - 26 - 3 * CHAR_WIDTH


def _line(pixels: Pixels, start: tuple[int, int], end: tuple[int, int], colour: tuple[int, int, int]) -> None:
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


def encode_png(pixels: Pixels) -> bytes:
    """An 8-bit RGB PNG of the rows (each row starts with filter byte 0: none)."""
    height, width = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(channel for pixel in row for channel in pixel) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
