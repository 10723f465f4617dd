"""`llama-chat convert`: a GGUF file or a Meta checkpoint becomes a Hugging Face directory
that loads to the same model, and that transformers itself can read."""

import json

import pytest
import torch
from gguf import GGMLQuantizationType as QType
from transformers import LlamaForCausalLM

import llama_chat
from llama_chat.checkpoints.hf import args_from_hf_config
from llama_chat.checkpoints.hf_writer import rope_scaling_config
from llama_chat.cli import main
from llama_chat.engine.config import RopeScaling

from .test_gguf import CHAT_TEMPLATE, tiny_hf_model, write_gguf
from .test_meta_checkpoint import llama2_style, llama3_style

TEXTS = ["Hello, world!", "Привет 你好 🙂", "  0.18 and <|im_end|> typed", "def f(x):\n    return x\n"]


def assert_same_model(original, converted) -> None:
    for text in TEXTS:
        ids = original.tokenizer.encode(text, add_bos=True)
        assert converted.tokenizer.encode(text, add_bos=True) == ids
        assert converted.tokenizer.decode(ids) == original.tokenizer.decode(ids)
        assert torch.allclose(converted.logits(ids), original.logits(ids), atol=1e-5, rtol=0)
    assert converted.stop_ids == original.stop_ids
    assert converted.chat_format.name == original.chat_format.name
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert converted.chat_format.encode(conversation) == original.chat_format.encode(conversation)


def convert(source, destination) -> None:
    assert main(["convert", str(source), str(destination)]) == 0


@pytest.mark.parametrize("qtype", [QType.F32, QType.Q8_0])
def test_gguf_converts_to_an_equivalent_directory(tmp_path, qtype):
    hf_model = tiny_hf_model(seed=4)
    source = write_gguf(tmp_path / "model.gguf", hf_model, qtype=qtype)
    convert(source, tmp_path / "converted")
    original = llama_chat.load(source, device="cpu", dtype="float32")
    converted = llama_chat.load(tmp_path / "converted", device="cpu", dtype="float32")
    assert_same_model(original, converted)
    config = json.loads((tmp_path / "converted" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE


def test_transformers_reads_the_converted_directory(tmp_path):
    source = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=5))
    convert(source, tmp_path / "converted")
    reference = LlamaForCausalLM.from_pretrained(tmp_path / "converted", dtype=torch.float32).eval()
    ours = llama_chat.load(source, device="cpu", dtype="float32")
    ids = [1, 70, 80, 90, 100, 200, 150, 2, 5]
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
    assert (ours.logits(ids) - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("style", ["llama2", "llama3"])
def test_meta_checkpoint_converts_to_an_equivalent_directory(tmp_path, style):
    _, source = llama2_style(tmp_path) if style == "llama2" else llama3_style(tmp_path, tied=False)
    convert(source, tmp_path / "converted")
    original = llama_chat.load(source, device="cpu", dtype="float32")
    converted = llama_chat.load(tmp_path / "converted", device="cpu", dtype="float32")
    assert_same_model(original, converted)


def test_convert_never_overwrites(tmp_path, capsys):
    source = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=6))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    assert main(["convert", str(source), str(tmp_path / "taken")]) == 1
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def test_a_destination_that_cannot_be_made_is_one_line(tmp_path, capsys):
    source = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=4), qtype=QType.F32)
    (tmp_path / "a-file").write_text("x")
    assert main(["convert", str(source), str(tmp_path / "a-file" / "converted")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("llama-chat: ") and "a-file" in error


@pytest.mark.parametrize("scaling", [
    RopeScaling(),
    RopeScaling(kind="linear", factor=2.5),
    RopeScaling(kind="llama3", factor=8.0, low_freq_factor=1.5, high_freq_factor=3.0,
                original_max_position_embeddings=64),
    RopeScaling(kind="longrope", short_factors=tuple(1.0 + i / 8 for i in range(8)), long_factors=(2.0,) * 8,
                original_max_position_embeddings=64, attention_factor=1.25),
])
def test_config_json_rope_scaling_reads_back_as_the_same_scaling(scaling):
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 300, "intermediate_size": 96, "max_position_embeddings": 128,
              "rope_scaling": rope_scaling_config(scaling)}
    assert args_from_hf_config(config).rope_scaling == scaling
