import builtins

import pytest
from matplotlib.image import imread

from llama_chat.train import plot as train_plot
from llama_chat.train.plot import (
    LOSS_LABEL,
    loss_figure,
    terminal_loss_curve,
    write_loss_plot,
)

TRAIN = [(step, 3.6 - step / 100) for step in range(0, 301, 10)]  # from 3.6 down to 0.6
VALIDATION = [(0, 2.5), (300, 1.5)]  # flatter: crosses the training curve


def test_the_figure_holds_both_curves_labelled_axes_a_legend_and_the_run(tmp_path):
    figure = loss_figure(TRAIN, VALIDATION, "run-7: 4 layers of 128, 300 steps")
    [axes] = figure.axes
    training, validation = axes.lines
    assert list(training.get_xdata()) == [step for step, _ in TRAIN]
    assert list(training.get_ydata()) == [loss for _, loss in TRAIN]
    assert list(validation.get_xdata()) == [0, 300] and list(validation.get_ydata()) == [2.5, 1.5]
    assert axes.get_title() == "run-7: 4 layers of 128, 300 steps"
    assert (axes.get_xlabel(), axes.get_ylabel()) == ("step", LOSS_LABEL)
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["training", "validation"]
    assert axes.get_yscale() == "linear" and len(axes.get_yticks()) >= 3
    assert loss_figure(TRAIN, VALIDATION, "run", log_scale=True).axes[0].get_yscale() == "log"


def test_the_png_is_written_at_its_size(tmp_path):
    path = tmp_path / "loss.png"
    assert write_loss_plot(path, TRAIN, VALIDATION, "run")
    assert imread(path).shape[:2] == (500, 800)  # 8 x 5 inches at 100 dpi


def test_a_diverged_run_plots_its_finite_losses():
    figure = loss_figure([(0, 2.5), (10, 2.0), (20, float("nan")), (30, float("inf"))], [(10, 2.2)], "run")
    training, validation = figure.axes[0].lines
    assert list(training.get_xdata()) == [0, 10] and list(validation.get_xdata()) == [10]


def test_the_terminal_curve_is_text_of_the_asked_size_with_title_and_labels():
    curve = terminal_loss_curve(TRAIN, VALIDATION, "run-7", width=60, height=14)
    lines = curve.splitlines()
    assert len(lines) == 14 and max(len(line) for line in lines) <= 60
    assert "run-7" in curve and "step" in curve and "training" in curve and "validation" in curve
    assert "\x1b[" not in curve  # plain text: the console prints it literally


def test_without_the_libraries_nothing_is_drawn_and_training_can_say_so(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_plotting(name, *args, **kwargs):
        if name.split(".")[0] in ("matplotlib", "plotext"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_plotting)
    assert write_loss_plot(tmp_path / "loss.png", TRAIN, VALIDATION, "run") is False
    assert not (tmp_path / "loss.png").exists()
    assert terminal_loss_curve(TRAIN, VALIDATION, "run") is None
    assert "pip install 'llama-chat[train]'" in train_plot.MISSING


@pytest.mark.parametrize("points", [[], [(0, float("nan"))]])
def test_no_finite_loss_yet_still_draws_empty_axes(points, tmp_path):
    assert write_loss_plot(tmp_path / "loss.png", points, [], "run")
    assert loss_figure(points, [], "run").axes[0].get_legend() is None
