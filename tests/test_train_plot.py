import struct
import zlib

from llama_chat.train_plot import BLACK, BLUE, GREY, HEIGHT, LEFT, ORANGE, WIDTH, write_loss_plot


def read_png(path) -> list[list[tuple[int, int, int]]]:
    """Rows of RGB pixels from an 8-bit RGB PNG whose rows all use filter 0 (as ours do)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, {}
    while position < len(data):
        (length,), kind = struct.unpack(">I", data[position : position + 4]), data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        assert struct.unpack(">I", data[position + 8 + length : position + 12 + length])[0] == zlib.crc32(kind + body)
        chunks[kind] = chunks.get(kind, b"") + body
        position += 12 + length
    width, height, depth, colour_type = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour_type) == (8, 2)
    raw = zlib.decompress(chunks[b"IDAT"])
    stride = 1 + 3 * width
    rows = []
    for y in range(height):
        line = raw[y * stride : (y + 1) * stride]
        assert line[0] == 0
        rows.append([tuple(line[1 + 3 * x : 4 + 3 * x]) for x in range(width)])
    return rows


def test_the_plot_shows_both_curves_a_labelled_grid_and_a_legend(tmp_path):
    path = tmp_path / "loss.png"
    train = [(step, 3.6 - step / 100) for step in range(0, 301, 10)]  # from 3.6 down to 0.6
    validation = [(0, 2.5), (300, 1.5)]  # flatter: crosses the training curve
    write_loss_plot(path, train, validation)
    pixels = read_png(path)
    assert (len(pixels), len(pixels[0])) == (HEIGHT, WIDTH)

    def columns_of(colour, rows=range(HEIGHT), columns=range(WIDTH)):
        return {x for y in rows for x in columns if pixels[y][x] == colour}

    # A grey grid line at 1, 2, 3 and 4 nats (the top of the axis is the next whole nat).
    grid_rows = [y for y in range(HEIGHT) if sum(p == GREY for p in pixels[y]) > WIDTH // 2]
    assert len({y for y in grid_rows if y - 1 not in grid_rows}) == 4
    # Each curve spans the plot from the first step to the last.
    plot_area = range(LEFT + 1, WIDTH - 40)
    assert columns_of(BLUE, range(40, HEIGHT - 41), plot_area) >= set(plot_area[::50])
    assert columns_of(ORANGE, range(40, HEIGHT - 41), plot_area) >= set(plot_area[::50])
    # Training starts above validation and ends below it.
    def top_row(colour, x):
        return min(y for y in range(40, HEIGHT - 40) if pixels[y][x] == colour)
    assert top_row(BLUE, LEFT + 5) < top_row(ORANGE, LEFT + 5)
    assert top_row(BLUE, WIDTH - 60) > top_row(ORANGE, WIDTH - 60)
    # Labels: the nats left of the axis, the steps below it, the legend above the plot.
    assert len(columns_of(BLACK, range(HEIGHT), range(0, LEFT - 4))) > 10
    assert len(columns_of(BLACK, range(HEIGHT - 30, HEIGHT), range(WIDTH))) > 30
    assert len(columns_of(BLUE, range(0, 30), range(WIDTH // 2, WIDTH))) > 20
    assert len(columns_of(ORANGE, range(0, 30), range(WIDTH // 2, WIDTH))) > 40


def test_a_single_point_still_draws(tmp_path):
    path = tmp_path / "loss.png"
    write_loss_plot(path, [(0, 2.5)], [])  # below the top of the axis (3)
    pixels = read_png(path)
    assert any(BLUE in row for row in pixels[40:])


def test_a_diverged_run_still_plots_its_finite_losses(tmp_path):
    path = tmp_path / "loss.png"
    write_loss_plot(path, [(0, 2.5), (10, 2.0), (20, float("nan")), (30, float("inf"))], [(10, 2.2)])
    pixels = read_png(path)
    assert any(BLUE in row for row in pixels[40:]) and any(ORANGE in row for row in pixels[40:])
