"""The loss curve of a training run: a PNG drawn by matplotlib, and a compact chart in the
terminal drawn by plotext, both optional (`pip install 'llama-chat[train]'`).

Training never depends on them: without them it runs as before and says once, in one
line, how to get the plot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

Point = tuple[float, float]  # (step, loss)

MISSING = "the loss plot needs matplotlib and plotext: pip install 'llama-chat[train]'"
LOSS_LABEL = "loss (nats per token)"


def finite(points: Sequence[Point]) -> tuple[list[float], list[float]]:
    """The steps and losses of the points whose loss is a number (a diverged run has others)."""
    kept = [(step, loss) for step, loss in points if math.isfinite(loss)]
    return [step for step, _ in kept], [loss for _, loss in kept]


def loss_figure(train: Sequence[Point], validation: Sequence[Point], title: str, log_scale: bool = False):
    """A matplotlib Figure of both curves, with labelled axes, a legend and the run's name."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    for points, label in ((train, "training"), (validation, "validation")):
        steps, losses = finite(points)
        if steps:
            axes.plot(steps, losses, label=label, marker="o" if label == "validation" else None, markersize=3)
    axes.set(title=title, xlabel="step", ylabel=LOSS_LABEL, yscale="log" if log_scale else "linear")
    axes.grid(True, which="both", alpha=0.3)
    if axes.lines:
        axes.legend()
    return figure


def write_loss_plot(
    path: Path, train: Sequence[Point], validation: Sequence[Point], title: str, log_scale: bool = False
) -> bool:
    """Save the loss curve as a PNG; False (and nothing written) without matplotlib."""
    try:
        figure = loss_figure(train, validation, title, log_scale)
    except ImportError:
        return False
    figure.savefig(path, dpi=100)
    return True


def terminal_loss_curve(train: Sequence[Point], validation: Sequence[Point], title: str, width: int = 72,
                        height: int = 16) -> str | None:
    """The curves as text for the terminal (plotext), or None without plotext."""
    try:
        import plotext
    except ImportError:
        return None
    plotext.clear_figure()
    plotext.plotsize(width, height)
    plotext.theme("clear")
    # Told apart by their marks, not colours: the text is printed as it is, without codes.
    for points, label, mark in ((train, "training", "braille"), (validation, "validation", "x")):
        steps, losses = finite(points)
        if steps:
            plotext.plot(steps, losses, label=label, marker=mark)
    plotext.title(title)
    plotext.xlabel("step")
    plotext.ylabel(LOSS_LABEL)
    return plotext.uncolorize(plotext.build())
