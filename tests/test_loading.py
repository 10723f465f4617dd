"""Finding the checkpoint a path holds, loading it where asked, and the one-line errors."""

import io
import sys

import pytest
import torch

import llama_chat
from llama_chat.chat.display import visible
from llama_chat.cli import main
from llama_chat.errors import LlamaChatError
from llama_chat.kernels import native_state

from .test_gguf import tiny_hf_model, write_gguf


@pytest.fixture
def gguf_file(tmp_path):
    return write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=7))


def test_a_directory_holding_one_gguf_file_loads_it(gguf_file):
    model = llama_chat.load(gguf_file.parent, device="cpu")
    assert model.name == gguf_file.parent.name
    assert model.chat_format.name == "template"  # the file carries a chat template


def test_requested_dtype_and_chat_format(gguf_file):
    model = llama_chat.load(gguf_file, device="cpu", dtype="bfloat16", chat_format="chatml", quantize="none")
    assert {p.dtype for p in model.transformer.parameters()} == {torch.bfloat16}
    assert model.chat_format.name == "chatml"
    assert model.transformer.output.weight.data_ptr() != model.transformer.tok_embeddings.weight.data_ptr()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "absent", "no such file or directory"),
        (lambda d: d, "no checkpoint; expected config.json"),
        (lambda d: (d / "notes.txt").write_text("hello") and d / "notes.txt", "not a GGUF file"),
    ],
)
def test_unusable_paths_are_explained(tmp_path, make, message):
    with pytest.raises(LlamaChatError, match=message):
        llama_chat.load(make(tmp_path), device="cpu")


def test_two_gguf_files_in_a_directory_must_be_named(tmp_path, gguf_file):
    (tmp_path / "other.gguf").write_bytes(gguf_file.read_bytes())
    with pytest.raises(LlamaChatError, match="2 .gguf files"):
        llama_chat.load(tmp_path, device="cpu")


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llama-chat: ")
    assert "Traceback" not in captured.err
    return lines[0]


def test_command_line_errors_are_one_line_with_exit_code_1(tmp_path, gguf_file, capsys):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(gguf_file.read_bytes()[: gguf_file.stat().st_size // 3])
    assert main(["--model", str(truncated), "-p", "hi"]) == 1
    assert "truncated.gguf" in one_line_error(capsys)
    assert main(["--model", str(tmp_path / "nowhere"), "-p", "hi"]) == 1
    assert "nowhere: no such file or directory" in one_line_error(capsys)


def test_bad_usage_exits_with_code_2(gguf_file, capsys):
    assert main(["--model", str(gguf_file), "--temperature", "-1", "-p", "hi"]) == 2
    assert "temperature must be 0 (greedy) or more" in one_line_error(capsys)


def test_one_prompt_prints_only_the_reply(gguf_file, capsys):
    assert main(["--model", str(gguf_file), "-p", "hi", "--temperature", "0", "--max-tokens", "5"]) == 0
    captured = capsys.readouterr()
    model = llama_chat.load(gguf_file, device="cpu")
    prompt = model.chat_format.encode([{"role": "user", "content": "hi"}])
    expected = model.generate(prompt, llama_chat.SamplingSettings(temperature=0, max_tokens=5))
    list(expected)
    assert captured.out == visible(expected.text) + "\n"
    # Nothing on stderr but, on a machine where llama-chat's kernels cannot be built, the line saying why.
    kernels = native_state.status()
    assert captured.err == (f"llama-chat: PyTorch's kernels run: {kernels.detail}\n" if kernels.wanting else "")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_slow_load_shows_progress_on_a_terminal_only(gguf_file, monkeypatch):
    from llama_chat.cli import load_progress

    monkeypatch.setattr(load_progress, "PROGRESS_AFTER_SECONDS", 0.0)  # every load counts as slow
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    llama_chat.load(gguf_file, device="cpu", progress=load_progress.LoadProgress)
    shown = terminal.getvalue()
    assert "loading tiny.gguf" in shown and "kB" in shown  # what is loaded, and how much of it
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    llama_chat.load(gguf_file, device="cpu", progress=load_progress.LoadProgress)
    assert piped.getvalue() == ""
