"""--prompt-math: prompt chunks exact (16-bit activations) or fast (8-bit activation blocks,
as ik_llama.cpp runs them), on llama-chat's kernels; decode and verify steps exact either way."""

import dataclasses

import pytest
import torch
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat.cli import main
from llama_chat.errors import UsageError
from llama_chat.kernels.block_linear import PROMPT_ROWS, BlockLinear

from .loading_helpers import options_from_environment
from .test_cli import typed_chats
from .test_gguf import tiny_hf_model, write_gguf


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("m") / "m.gguf", tiny_hf_model(seed=4), qtype=QType.Q8_0)


def prompt(length: int) -> list[int]:
    return [(7 * n + 3) % 250 + 1 for n in range(length)]


@pytest.mark.needs_kernels
def test_fast_prompt_chunks_are_the_8_bit_kernels_and_short_steps_stay_exact(q8_file):
    options = options_from_environment()
    exact = llama_chat.load(q8_file, options, device="cpu")
    fast = llama_chat.load(q8_file, dataclasses.replace(options, prompt_math="fast"), device="cpu")
    long, short = prompt(PROMPT_ROWS + 8), prompt(PROMPT_ROWS)
    assert fast.prompt_math == "fast" and exact.prompt_math == "exact"
    matrices = [m for m in fast.transformer.modules() if isinstance(m, BlockLinear)]
    assert matrices and all(m.fast_prompts for m in matrices)
    matrix = matrices[0]
    x = torch.randn(PROMPT_ROWS + 8, matrix.in_features, generator=torch.Generator().manual_seed(0))
    with_fast = matrix(x)
    matrix.fast_prompts, matrix.activation_bits = False, 8
    assert torch.equal(with_fast, matrix(x))  # ik's arithmetic: 8-bit activation blocks, for a prompt chunk
    matrix.fast_prompts, matrix.activation_bits = True, 16
    assert not torch.equal(fast.logits(long), exact.logits(long))
    assert torch.equal(fast.logits(short), exact.logits(short))  # a verify step or a short turn: exact
    assert torch.equal(fast.logits(short[:1]), exact.logits(short[:1]))
    close = torch.log_softmax(exact.logits(long), -1)
    kl = (close.exp() * (close - torch.log_softmax(fast.logits(long), -1))).sum(-1).mean()
    assert 0 < kl < 1e-2

    fast.set_prompt_math("exact")  # switched in the chat: exact again
    assert torch.equal(fast.logits(long), exact.logits(long))


def test_an_unknown_prompt_math_is_refused(tiny_model):
    with pytest.raises(UsageError, match="use exact or fast"):
        tiny_model.set_prompt_math("sloppy")
    assert "prompts stay exact" in tiny_model.set_prompt_math("fast")  # dense weights: nothing to switch
    assert tiny_model.prompt_math == "exact" and "8-bit" not in tiny_model.describe_weights()


@pytest.mark.needs_kernels
def test_prompt_math_in_the_chat_is_shown_switched_and_kept_across_load(q8_file, monkeypatch):
    sessions, shown = typed_chats(monkeypatch, ["/prompt-math", "/prompt-math fast", "/prompt-math sloppy",
                                                f"/load {q8_file}", "/settings", "/quit"])
    assert main(["-m", str(q8_file), "--compile", "off"]) == 0
    text = shown.getvalue()
    assert "prompt math = exact\n" in text and "unknown prompt math 'sloppy'" in text
    assert "prompt math = fast" in text.split("loaded m.gguf")[1]
    assert sessions[0].model.prompt_math == "fast"


@pytest.mark.needs_kernels
def test_the_flag_sets_it_from_the_start(q8_file, monkeypatch):
    sessions, shown = typed_chats(monkeypatch, ["/settings", "/device", "/quit"])
    assert main(["-m", str(q8_file), "--compile", "off", "--prompt-math", "fast"]) == 0
    assert "prompt math = fast\n" in shown.getvalue()
    assert "prompt chunks with 8-bit activation blocks (--prompt-math fast)" in shown.getvalue()  # /device
    with pytest.raises(SystemExit) as refused:
        main(["-m", str(q8_file), "--prompt-math", "sloppy", "-p", "hi"])
    assert refused.value.code == 2


def test_the_flag_where_nothing_runs_on_our_kernels_says_so_in_one_line(q8_file, capsys):
    assert main(["-m", str(q8_file), "--quantize", "none", "--prompt-math", "fast", "-p", "hi", "--max-tokens",
                 "2"]) == 0
    assert "--prompt-math fast does nothing here: prompts stay exact" in capsys.readouterr().err
