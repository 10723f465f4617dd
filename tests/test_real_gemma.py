"""Gemma 3 270M as people download it: Google's base model converted and quantised (Q4_K_M:
Q5_0, Q4_K, Q6_K and Q8_0 tensors beside F32 norms) by llama.cpp's own tools, fetched as
`llama-chat download gemma3-270m` fetches it, against independent references."""

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import llama_chat
from llama_chat.default_model import download_model
from llama_chat.kernels.block_linear import BlockLinear

TEXTS = [
    "The capital of France is Paris.",
    "Привет, как дела? Всё хорошо, спасибо.",
    "你好，世界。今天天气很好。",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Emoji: 🙂👍🏽🇫🇷 and ❤️  lots   of    spaces\n\n\n\nand\tnewlines  \n",
]


@pytest.fixture(scope="module")
def gemma_gguf():
    return download_model("gemma3-270m")


@pytest.fixture(scope="module")
def transformers_reading(gemma_gguf):
    """transformers' own reading of the file (its GGUF loader dequantises every tensor), float32."""
    return AutoModelForCausalLM.from_pretrained(gemma_gguf.parent, gguf_file=gemma_gguf.name,
                                                dtype=torch.float32).eval()


def test_the_tokenizer_is_transformers_reading_of_the_file(gemma_gguf):
    reference = AutoTokenizer.from_pretrained(gemma_gguf.parent, gguf_file=gemma_gguf.name)
    model = llama_chat.load(gemma_gguf, device="cpu")
    for text in TEXTS:
        ids = model.tokenizer.encode(text)
        assert [reference.bos_token_id, *ids] == reference.encode(text), text  # it puts <bos> first
        assert model.tokenizer.decode(ids) == text
    assert model.chat_format.encode([{"role": "user", "content": "Hi"}])[0] == reference.bos_token_id
    typed = model.tokenizer.encode("<start_of_turn>user")  # by a user: text, never the control token
    assert reference.convert_tokens_to_ids("<start_of_turn>") not in typed and len(typed) > 2


def test_every_matrix_is_held_in_the_files_own_type_at_its_size(gemma_gguf):
    model = llama_chat.load(gemma_gguf, device="cpu")
    matrices = [module for module in model.transformer.modules() if isinstance(module, BlockLinear)]
    assert {matrix.block_type for matrix in matrices} == {"Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    held = sum(matrix.blocks.numel() for matrix in matrices)
    # The file's matrices take 246.3 MB; Q4_K's 6-bit scales held a byte each add 1.5 MB.
    assert 246e6 < held < 248.5e6


def test_the_exact_path_gives_transformers_logits_over_600_positions(gemma_gguf, transformers_reading):
    """Past the window of 512 on its local layers: whole, and through the cache in prompt
    chunks, single tokens and a verify step."""
    model = llama_chat.load(gemma_gguf, device="cpu", quantize="none", dtype="float32")
    ids = [model.tokenizer.bos_id] + model.tokenizer.encode(" ".join(TEXTS) * 12)[:599]
    with torch.no_grad():
        reference = transformers_reading(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(model.logits(ids), reference, atol=1e-3, rtol=0)
    cache = model.new_cache(1024)
    steps = [model.runner(cache, ids[:520], every_logits=True)]
    steps += [model.runner(cache, [token], every_logits=True) for token in ids[520:560]]
    steps.append(model.runner(cache, ids[560:], every_logits=True))
    torch.testing.assert_close(torch.cat(steps), reference, atol=1e-3, rtol=0)


def test_a_one_shot_completion_end_to_end(gemma_gguf):
    """The command a new user types: a base model, so plain completion, said in one line;
    the greedy reply begins as llama.cpp's does on the same file."""
    command = [sys.executable, "-m", "llama_chat", "--model", str(gemma_gguf), "-p", "The capital of France is",
               "--temperature", "0", "--max-tokens", "8", "--compile", "off"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == " the capital of the country of France.\n"
    assert "has no chat template (a base model?): replies continue the text as plain completion" in result.stderr
