import os
import random
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import llama_chat
from llama_chat.cli import main as cli_main
from llama_chat.cli.train import main
from llama_chat.directories import recover_directory
from llama_chat.errors import LlamaChatError, UsageError
from llama_chat.train import run as train_module
from llama_chat.train.config import TrainConfig, learning_rate
from llama_chat.train.data import read_corpus, train_tokenizer
from llama_chat.train.run import STATE_FILE, Run, train

TINY = TrainConfig(
    dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=64, context=32, batch_size=8, steps=40,
    learning_rate=1e-2, warmup=5, tokenizer="char", eval_every=10, eval_batches=2, save_every=15,
    sample_every=20, sample_tokens=8,
)
TINY_FLAGS = [
    "--tokenizer", "char", "--dim", "32", "--n-layers", "2", "--n-heads", "4", "--n-kv-heads", "2",
    "--hidden-dim", "64", "--context", "32", "--batch-size", "8", "--steps", "20", "--learning-rate", "0.01",
    "--warmup", "5", "--eval-every", "5", "--eval-batches", "2", "--save-every", "7", "--sample-every", "0",
    "--quiet",
]


def play(lines: int, seed: int = 0) -> str:
    """A few kilobytes of made-up dialogue with a small vocabulary: quick to learn."""
    rng = random.Random(seed)
    words = "the king queen crown night love speak hear thou art my lord good sir".split()
    return "".join(
        f"{rng.choice(['ROMEO', 'JULIET', 'NURSE'])}: {' '.join(rng.choices(words, k=rng.randint(3, 8)))}.\n"
        for _ in range(lines)
    )


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    path = tmp_path / "play.txt"
    path.write_text(play(300), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Run:
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("train")
    corpus_path = directory / "play.txt"
    corpus_path.write_text(play(300), encoding="utf-8")
    run = Run(TINY, read_corpus([corpus_path], TINY.validation_fraction), directory / "out", torch.device("cpu"))
    assert train(run, quiet=True)
    return run


def test_loss_decreases(finished_run):
    train_losses = [loss for _, loss in finished_run.history.train]
    validation = finished_run.history.validation
    assert [step for step, _ in validation] == [10, 20, 30, 40]
    assert sum(train_losses[-5:]) / 5 < 0.6 * sum(train_losses[:5]) / 5
    assert validation[-1][1] < validation[0][1] < train_losses[0]
    assert (finished_run.out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_validation_split_is_disjoint_and_complete(tmp_path):
    files = []
    for index in range(2):
        path = tmp_path / f"part{index}.txt"
        path.write_text("".join(f"file {index} line {n}\n" for n in range(100)), encoding="utf-8")
        files.append(path)
    corpus = read_corpus(files, 0.25)
    train_lines = set(corpus.train_text.splitlines())
    validation_lines = set(corpus.validation_text.splitlines())
    assert not train_lines & validation_lines
    assert len(train_lines) + len(validation_lines) == 200
    # Every file gives its own last quarter (whole lines) to validation.
    assert {"file 0 line 99", "file 1 line 99", "file 0 line 76", "file 1 line 76"} <= validation_lines
    assert {"file 0 line 74", "file 1 line 74"} <= train_lines


def test_checkpoint_reloads_and_reproduces_logits(finished_run):
    ids = finished_run.tokenizer.encode("ROMEO: good night", add_bos=True)
    with torch.no_grad():
        expected = finished_run.transformer(torch.tensor([ids]))[0]
    model = llama_chat.load(finished_run.out, device="cpu", dtype="float32", quantize="none")
    assert torch.equal(model.logits(ids), expected)
    assert model.tokenizer.decode(model.tokenizer.encode("JULIET: thou art\n")) == "JULIET: thou art\n"


def test_learning_rate_warms_up_then_decays_to_the_floor():
    config = replace(TINY, steps=100, warmup=10, learning_rate=1.0, min_learning_rate_ratio=0.1)
    assert learning_rate(config, 0) == pytest.approx(0.1)
    assert learning_rate(config, 9) == pytest.approx(1.0)
    assert learning_rate(config, 55) == pytest.approx(0.55)
    assert learning_rate(config, 100) == pytest.approx(0.1)


def test_ctrl_c_saves_and_resume_equals_an_uninterrupted_run(tmp_path, corpus_file, monkeypatch):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert main(["--data", str(corpus_file), "--out", str(straight), *TINY_FLAGS]) == 0

    original_step = Run.train_step

    def step_then_ctrl_c(run):
        loss = original_step(run)
        if run.step == 9:
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    monkeypatch.setattr(Run, "train_step", step_then_ctrl_c)
    assert main(["--data", str(corpus_file), "--out", str(interrupted), *TINY_FLAGS]) == 130
    assert torch.load(interrupted / STATE_FILE, weights_only=True)["step"] == 9
    monkeypatch.undo()
    assert main(["--data", str(corpus_file), "--out", str(interrupted), "--resume", "--quiet"]) == 0

    expected, resumed = load_file(straight / "model.safetensors"), load_file(interrupted / "model.safetensors")
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)
    straight_state = torch.load(straight / STATE_FILE, weights_only=True)
    resumed_state = torch.load(interrupted / STATE_FILE, weights_only=True)
    assert resumed_state["step"] == straight_state["step"] == 20
    assert resumed_state["history"] == straight_state["history"]


def test_failed_save_leaves_the_previous_checkpoint(finished_run, monkeypatch):
    before = load_file(finished_run.out / "model.safetensors")
    gains = finished_run.transformer.norm.weight
    saved_gains = gains.detach().clone()
    with torch.no_grad():
        gains.add_(1.0)  # a change the failed save must not publish

    def disk_full(*args, **keywords):
        raise OSError("no space left on device")

    monkeypatch.setattr(train_module, "write_loss_plot", disk_full)
    with pytest.raises(OSError, match="no space"):
        finished_run.save()
    with torch.no_grad():
        gains.copy_(saved_gains)
    after = load_file(finished_run.out / "model.safetensors")
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert sorted(p.name for p in finished_run.out.parent.iterdir() if p.name.startswith(".")) == []
    llama_chat.load(finished_run.out, device="cpu", dtype="float32", quantize="none")


def test_a_crash_between_the_renames_is_recovered(tmp_path):
    out = tmp_path / "out"
    previous = tmp_path / ".out.previous"
    previous.mkdir()
    (previous / STATE_FILE).write_bytes(b"state")
    recover_directory(out)
    assert (out / STATE_FILE).read_bytes() == b"state"
    assert not previous.exists()


@pytest.mark.parametrize(
    ("setup", "flags", "error", "message"),
    [
        ("missing", [], LlamaChatError, "no such file"),
        ("empty", [], LlamaChatError, "the file is empty"),
        ("short", [], LlamaChatError, "less than one context window"),
        ("play", ["--tokenizer", "char", "--vocab-size", "500"], UsageError, "does not apply"),
        ("play", ["--validation-fraction", "1.5"], UsageError, "between 0 and 1"),
        ("play", ["--dim", "30", "--n-heads", "4"], LlamaChatError, "not divisible"),
        ("play", ["--n-kv-heads", "0"], LlamaChatError, "n_kv_heads must be positive"),
        ("play", ["--sample-tokens", "0"], UsageError, "--sample-tokens must be positive"),
        ("play", ["--threads", "-1"], UsageError, "--threads must be positive"),
    ],
)
def test_bad_input_is_refused(tmp_path, setup, flags, error, message):
    data = tmp_path / "data.txt"
    texts = {"empty": " \n", "short": "ROMEO: hi.\n" * 4, "play": play(300)}
    if setup in texts:
        data.write_text(texts[setup], encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(error, match=message):
        main(["--data", str(data), "--out", str(out), *TINY_FLAGS, *flags])
    assert not out.exists()


def test_a_learning_rate_that_is_not_finite_is_refused(tmp_path, corpus_file, capsys):
    with pytest.raises(SystemExit):
        main(["--data", str(corpus_file), "--out", str(tmp_path / "out"), *TINY_FLAGS, "--learning-rate", "nan"])
    assert "not a finite number: 'nan'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_resume_of_a_damaged_state_file_is_one_clear_error(finished_run, tmp_path):
    out = shutil.copytree(finished_run.out, tmp_path / "out")  # the shared run stays whole
    (out / STATE_FILE).write_bytes(b"not a state")
    corpus = finished_run.out.parent / "play.txt"
    with pytest.raises(LlamaChatError, match="not a training state this version can resume"):
        main(["--data", str(corpus), "--out", str(out), "--resume"])


def test_resume_needs_a_run(tmp_path, corpus_file):
    with pytest.raises(UsageError, match="no training run to resume"):
        main(["--data", str(corpus_file), "--out", str(tmp_path / "out"), "--resume"])
    assert not (tmp_path / "out").exists()


def test_resume_refuses_new_settings(finished_run):
    corpus = finished_run.out.parent / "play.txt"
    with pytest.raises(UsageError, match="drop --dim, --steps"):
        main(["--data", str(corpus), "--out", str(finished_run.out), "--resume", "--dim", "64", "--steps", "9"])


def test_resume_refuses_other_data(finished_run, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text(play(300, seed=1), encoding="utf-8")
    with pytest.raises(LlamaChatError, match="trained on other data"):
        main(["--data", str(other), "--out", str(finished_run.out), "--resume"])


def test_bpe_tokenizer_keeps_text_exactly_in_fewer_tokens():
    text = play(300)
    tokenizer = train_tokenizer(text, "bpe", 400)
    sample = "NURSE: good night, sweet lord.\n\n  thou art é\n"
    assert tokenizer.decode(tokenizer.encode(sample)) == sample
    assert len(tokenizer.encode(text)) < 0.5 * len(text)
    assert tokenizer.vocab_size <= 400
    with pytest.raises(LlamaChatError, match="--vocab-size 200 is too small"):
        train_tokenizer(text, "bpe", 200)


def test_output_holding_other_files_is_left_alone(tmp_path, corpus_file, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    assert cli_main(["train", "--data", str(corpus_file), "--out", str(out), *TINY_FLAGS]) == 2
    error = capsys.readouterr().err
    assert error == f"llama-chat: {out} already holds other files; give a new or empty --out directory\n"
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_the_end_of_a_run_shows_its_curve_or_says_how_to_get_it(corpus_file, tmp_path, capsys, monkeypatch):
    config = replace(TINY, steps=4, eval_every=2, save_every=100, sample_every=0)
    run = Run(config, read_corpus([corpus_file], config.validation_fraction), tmp_path / "out", torch.device("cpu"))
    assert train(run)
    shown = capsys.readouterr().err
    assert "out: 2 layers of" in shown and "step" in shown and train_module.MISSING not in shown
    # Without matplotlib and plotext, training still runs and says in one line how to get them.
    monkeypatch.setattr(train_module, "terminal_loss_curve", lambda *args: None)
    monkeypatch.setattr(train_module, "write_loss_plot", lambda *args, **keywords: False)
    other = Run(config, read_corpus([corpus_file], config.validation_fraction), tmp_path / "other",
                torch.device("cpu"))
    assert train(other)
    assert capsys.readouterr().err.count(train_module.MISSING) == 1
