"""--raw (the plain format) starts a text with bos only where the model's tokenizer does,
as llama.cpp and transformers read it from the model's files."""

import json
from pathlib import Path

import gguf
import pytest
import torch
from tokenizers import AddedToken, processors

import llama_chat
from llama_chat.cli import main
from llama_chat.default_model import DEFAULT_MODEL, download_model

from .hf_reference import random_hf_model
from .test_default_model import reference_tokenizer
from .test_gguf import tiny_hf_model, write_gguf
from .test_hf_tokenizer import spm_metadata, train_sentencepiece

TEXT = "Once upon a time, in a quiet village by the sea, there lived"
NEW_TOKENS = 12
CONTROL = 3  # llama.cpp's token type of control tokens


def write_smollm2_tokenizer(gguf_path: Path, directory: Path, bos_first: bool = False) -> None:
    """SmolLM2's tokenizer.json and tokenizer_config.json as published, rebuilt from the default
    model's vocabulary and merges: a byte-level post-processor, which adds no bos (`bos_first`:
    one that puts <|im_start|> first), and a config that does not mention add_bos_token."""
    tokenizer = reference_tokenizer(gguf_path)
    fields = gguf.GGUFReader(gguf_path).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    token_types = fields["tokenizer.ggml.token_type"].contents()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    if bos_first:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)]
        )
    controls = [token for token, kind in zip(tokens, token_types) if kind == CONTROL]
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in controls])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>", "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": 8192, "clean_up_tokenization_spaces": False,
    }))


@pytest.fixture(scope="module")
def smollm2_directory(tmp_path_factory):
    """A tiny random Llama saved as a Hugging Face folder, for SmolLM2's tokenizer."""
    directory = tmp_path_factory.mktemp("smollm2-tokenizer")
    model = random_hf_model(seed=5, vocab_size=49152, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    model.save_pretrained(directory)
    return directory, model


def raw_run(model_path: Path, saved: Path) -> tuple[list[int], list[int]]:
    """The prompt ids and greedy reply ids of `llama-chat --raw` on TEXT, from its saved conversation."""
    argv = ["--model", str(model_path), "--raw", "-p", TEXT, "--temperature", "0", "--max-tokens", str(NEW_TOKENS),
            "--device", "cpu", "--dtype", "float32", "--quantize", "none", "--save", str(saved)]
    assert main(argv) == 0
    conversation = json.loads(saved.read_text())
    user, reply = conversation["messages"]
    return conversation["head_ids"] + user["token_ids"], reply["token_ids"]


@pytest.mark.parametrize("bos_first", [False, True], ids=["as-published", "bos-in-post-processor"])
def test_raw_mode_feeds_and_continues_as_transformers_does(smollm2_directory, tmp_path, capsys, bos_first):
    from transformers import AutoTokenizer

    directory, model = smollm2_directory
    write_smollm2_tokenizer(download_model(DEFAULT_MODEL), directory, bos_first)
    reference = AutoTokenizer.from_pretrained(directory)
    expected_prompt = reference(TEXT)["input_ids"]
    # As published, SmolLM2's tokenizer puts no <|im_start|> (id 1) before a text.
    assert (expected_prompt[0] == 1) == bos_first
    prompt, reply = raw_run(directory, tmp_path / "chat.json")
    assert prompt == expected_prompt
    with torch.no_grad():
        generated = model.generate(
            torch.tensor([expected_prompt]), attention_mask=torch.ones(1, len(expected_prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=2,
        )[0, len(expected_prompt):].tolist()
    assert len(reply) == NEW_TOKENS and reply == generated
    assert capsys.readouterr().out.startswith(reference.decode(generated[:1]))


def add_bos_key(add_bos: bool | None):
    """A write_gguf `extra` writing tokenizer.ggml.add_bos_token (None: no key)."""
    def extra(writer: gguf.GGUFWriter) -> None:
        if add_bos is not None:
            writer.add_add_bos_token(add_bos)
    return extra


@pytest.mark.parametrize("add_bos", [False, True, None])
def test_a_gguf_says_whether_raw_text_starts_with_bos(tmp_path, add_bos):
    """The byte-level vocabulary's bos is <|im_start|> (id 1); with no key, llama.cpp adds
    none for this pre-tokenizer."""
    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model(), extra=add_bos_key(add_bos))
    model = llama_chat.load(path, device="cpu", dtype="float32", quantize="none", chat_format="plain")
    text_ids = model.tokenizer.encode(TEXT)
    assert model.chat_format.encode([{"role": "user", "content": TEXT}]) == [1] * bool(add_bos) + text_ids


@pytest.mark.parametrize("add_bos, expected", [(False, False), (None, True)])
def test_a_sentencepiece_gguf_starts_raw_text_with_bos_unless_told(tmp_path, add_bos, expected):
    """Llama 1 and 2 files: llama.cpp adds bos for a SentencePiece vocabulary with no key."""
    sp = train_sentencepiece(tmp_path)
    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model(vocab_size=sp.GetPieceSize()),
                      extra=add_bos_key(add_bos), vocabulary=spm_metadata(sp))
    model = llama_chat.load(path, device="cpu", dtype="float32", quantize="none", chat_format="plain")
    prompt = model.chat_format.encode([{"role": "user", "content": TEXT}])
    assert prompt == [sp.bos_id()] * expected + sp.encode(TEXT)
