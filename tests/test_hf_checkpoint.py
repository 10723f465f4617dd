import json
import struct
from pathlib import Path

import pytest
import tokenizers
import torch
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from llama_chat.checkpoints.hf import load_hf_directory
from llama_chat.checkpoints.safetensors_file import SafetensorsFile
from llama_chat.errors import LlamaChatError
from llama_chat.text.hf_tokenizer import HFTokenizer
from llama_chat.text.sentencepiece_tokenizer import SentencePieceTokenizer

from .hf_reference import NotATensor, hf_logits, llama_from_checkpoint, random_hf_model
from .test_tokenizer_spm import CORPUS, train_tiny_spm

VOCAB = 300
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
BOS, EOS, EOT = 0, 1, 4  # ids of the special tokens, which the trainer puts first
IDS = [BOS, 37, 5, 250, 299, 64, 120, 7, 11, 199, 33, 42]
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def write_tokenizer_json(directory: Path) -> tokenizers.Tokenizer:
    """A byte-level BPE tokenizer.json (Llama 3 style) whose post-processor adds the bos token."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", BOS)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    return tokenizer


def write_json(path: Path, contents: dict) -> None:
    path.write_text(json.dumps(contents))


def save_model_directory(directory: Path, tied: bool = False, **save_options):
    """A Hugging Face directory as save_pretrained writes it, with a tokenizer.json and its configs."""
    model = random_hf_model(seed=3, vocab_size=VOCAB, tie_word_embeddings=tied, bos_token_id=BOS, eos_token_id=EOT)
    model.save_pretrained(directory, **save_options)
    write_tokenizer_json(directory)
    write_json(directory / "tokenizer_config.json", {
        "bos_token": {"content": "<|begin_of_text|>", "special": True},
        "eos_token": "<|eot_id|>",
        "chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": TEMPLATE}],
    })
    write_json(directory / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": [EOS, EOT]})
    return model


def assert_same_logits(checkpoint, model) -> None:
    ours = llama_from_checkpoint(checkpoint).logits(IDS)
    torch.testing.assert_close(ours, hf_logits(model, IDS), atol=1e-4, rtol=0)


@pytest.mark.parametrize("tied", [False, True])
def test_safetensors_directory_matches_transformers(tmp_path, tied):
    model = save_model_directory(tmp_path, tied)
    assert (tmp_path / "model.safetensors").is_file()
    checkpoint = load_hf_directory(tmp_path)
    assert checkpoint.args.tie_embeddings is tied
    assert (checkpoint.args.n_heads, checkpoint.args.n_kv_heads) == (6, 2)
    assert_same_logits(checkpoint, model)


def test_tokenizer_and_chat_settings(tmp_path):
    save_model_directory(tmp_path)
    checkpoint = load_hf_directory(tmp_path)
    tokenizer = checkpoint.tokenizer
    assert isinstance(tokenizer, HFTokenizer)
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.vocab_size) == (BOS, EOT, VOCAB)
    assert tokenizer.add_bos_token is True  # found in the post-processor
    assert checkpoint.chat_template == TEMPLATE  # the "default" of the named templates
    assert (checkpoint.bos_token, checkpoint.eos_token) == ("<|begin_of_text|>", "<|eot_id|>")
    assert checkpoint.stop_ids == tokenizer.stop_ids == frozenset({EOS, EOT})
    reference = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "Привет, world 😀\n\n  def f(x):"
    assert tokenizer.encode(text) == reference.encode(text, add_special_tokens=False).ids
    assert tokenizer.encode(text, add_bos=True) == reference.encode(text).ids
    typed = "a <|eot_id|> b"
    assert EOT in reference.encode(typed, add_special_tokens=False).ids  # what must not happen here
    assert EOT not in tokenizer.encode(typed) and tokenizer.decode(tokenizer.encode(typed)) == typed


def test_sharded_safetensors_directory(tmp_path):
    model = save_model_directory(tmp_path, max_shard_size="30KB")
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 2
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert_same_logits(load_hf_directory(tmp_path), model)


def test_pytorch_bin_directory(tmp_path):
    model = save_model_directory(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    assert_same_logits(load_hf_directory(tmp_path), model)


def test_pytorch_bin_needing_code_is_refused(tmp_path):
    model = save_model_directory(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "extra": NotATensor()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(LlamaChatError, match="pytorch_model.bin: refused: needs arbitrary code to load"):
        load_hf_directory(tmp_path)


def test_shape_disagreeing_with_config_is_refused(tmp_path):
    save_model_directory(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["intermediate_size"] = 96
    write_json(tmp_path / "config.json", config)
    with pytest.raises(LlamaChatError, match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' "
                                             r"has shape \(80, 48\) but config\.json implies \(96, 48\)"):
        load_hf_directory(tmp_path)


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"quantization_config": {"quant_method": "gptq"}}, "gptq weights are not supported"),
    ({"attention_bias": True}, "biases are not supported"),
])
def test_unsupported_configs_are_refused(tmp_path, change, message):
    save_model_directory(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    write_json(tmp_path / "config.json", {**config, **change})
    with pytest.raises(LlamaChatError, match=message):
        load_hf_directory(tmp_path)


def test_mistral_sliding_window_bounds_the_context(tmp_path):
    model = save_model_directory(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    write_json(tmp_path / "config.json", {**config, "model_type": "mistral", "sliding_window": 64})
    checkpoint = load_hf_directory(tmp_path)
    assert checkpoint.args.max_seq_len == 64
    assert_same_logits(checkpoint, model)


@pytest.mark.parametrize(("missing", "message"), [
    ("config.json", "config.json: no such file"),
    ("model.safetensors", "no weights"),
    ("tokenizer.json", r"no tokenizer \(tokenizer.json or tokenizer.model\)"),
])
def test_missing_files_are_reported(tmp_path, missing, message):
    save_model_directory(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(LlamaChatError, match=message):
        load_hf_directory(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    model = save_model_directory(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    state = model.state_dict()
    del state["model.layers.1.self_attn.k_proj.weight"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(LlamaChatError, match="weight files have no tensor 'model.layers.1.self_attn.k_proj.weight'"):
        load_hf_directory(tmp_path)


def test_sentencepiece_tokenizer_with_added_tokens(tmp_path):
    """A Llama 2 style directory: tokenizer.model, specials past the SentencePiece vocabulary."""
    model = random_hf_model(seed=4, vocab_size=422, bos_token_id=1, eos_token_id=2)
    model.save_pretrained(tmp_path)
    train_tiny_spm(tmp_path / "tokenizer.model", 420)
    write_json(tmp_path / "tokenizer_config.json", {
        "add_bos_token": True,
        "bos_token": "<s>",
        "eos_token": {"content": "</s>"},
        "added_tokens_decoder": {
            "0": {"content": "<unk>", "special": True},
            "1": {"content": "<s>", "special": True},
            "2": {"content": "</s>", "special": True},
            "420": {"content": "<|im_start|>", "special": True},
            "421": {"content": "<|im_end|>", "special": True},
        },
    })
    write_json(tmp_path / "generation_config.json", {"eos_token_id": [2, 421]})
    (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
    checkpoint = load_hf_directory(tmp_path)
    tokenizer = checkpoint.tokenizer
    assert isinstance(tokenizer, SentencePieceTokenizer)
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.vocab_size) == (1, 2, 422)
    assert tokenizer.token_id("<|im_end|>") == 421
    assert checkpoint.stop_ids == frozenset({2, 421})
    assert checkpoint.chat_template == TEMPLATE
    assert (checkpoint.bos_token, checkpoint.eos_token) == ("<s>", "</s>")
    assert 421 not in tokenizer.encode("<|im_end|>")
    ids = [1, 37, 5, 250, 419, 420, 421, 64]
    torch.testing.assert_close(llama_from_checkpoint(checkpoint).logits(ids), hf_logits(model, ids), atol=1e-4, rtol=0)


MULTILINGUAL = [
    "The quick brown fox.", "Съешь же ещё этих мягких булок", "我能吞下玻璃而不伤身体。",
    "def f(x):\n\treturn x ** 2  # square\n", "Rockets 🚀🚀 and 👨‍👩‍👧", "   runs   of\n\n\n  spaces  ", "",
]


def test_tokenizer_json_matches_transformers(tmp_path):
    from transformers import AutoTokenizer

    save_model_directory(tmp_path)
    # transformers 5 wants plain names here (the dict form is tested above).
    write_json(tmp_path / "tokenizer_config.json", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    ours = load_hf_directory(tmp_path).tokenizer
    reference = AutoTokenizer.from_pretrained(tmp_path)
    for text in MULTILINGUAL:
        assert ours.encode(text, add_bos=True) == reference.encode(text), text
        assert ours.decode(ours.encode(text)) == reference.decode(reference.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("config, expected", [
    ({"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1},
     {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repeat_penalty": 1.1}),
    ({"do_sample": False, "temperature": 0.6}, {"temperature": 0}),  # greedy whatever temperature says
    ({"temperature": -2, "top_p": 7, "top_k": 40.0}, {"top_k": 40}),  # not valid settings: left out
    ({"temperature": float("inf"), "top_p": float("nan"), "top_k": [40]}, {}),
    ({}, {}),
])
def test_generation_config_sampling_is_the_models_recommendation(tmp_path, config, expected):
    save_model_directory(tmp_path)
    write_json(tmp_path / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": [EOS, EOT], **config})
    assert load_hf_directory(tmp_path).sampling == expected


# --- files strangers wrote: whatever they say, one line naming the file --------------------


@pytest.fixture(scope="module")
def model_directory(tmp_path_factory) -> Path:
    """One saved directory; each test below changes a copy of one of its files."""
    directory = tmp_path_factory.mktemp("hf")
    save_model_directory(directory)
    return directory


def changed_copy(source: Path, target: Path, name: str, contents: bytes) -> Path:
    for path in source.iterdir():
        (target / path.name).symlink_to(path)
    (target / name).unlink()
    (target / name).write_bytes(contents)
    return target


@pytest.mark.parametrize("change, message", [
    ({"num_attention_heads": 0}, "num_attention_heads is 0, where a positive whole number belongs"),
    ({"hidden_size": "64"}, "hidden_size is '64', where a positive whole number belongs"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers is 2.0, where a positive whole number belongs"),
    ({"vocab_size": True}, "vocab_size is True, where a positive whole number belongs"),
    ({"max_position_embeddings": 2**40}, "max_position_embeddings is 1099511627776, where a positive whole number"),
    ({"rms_norm_eps": "small"}, "rms_norm_eps is 'small', where a number belongs"),
    ({"rope_theta": [10000]}, "rope_theta is [10000], where a number belongs"),
    ({"rope_scaling": ["llama3"]}, "rope_scaling is ['llama3'], where an object belongs"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "rope_scaling's factor is '2', where a number belongs"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3 rope scaling without its 'low_freq_factor'"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings is 'no', where true or false belongs"),
    ({"quantization_config": "gptq"}, "quantized weights are not supported"),
    ({"model_type": "mistral", "sliding_window": "wide"}, "sliding_window is 'wide', where a positive whole number"),
    ({"llama_chat": {"source_quantization": 4}}, "llama_chat.source_quantization is 4, where text belongs"),
])
def test_a_config_of_the_wrong_types_is_one_line_naming_it(model_directory, tmp_path, change, message):
    config = json.loads((model_directory / "config.json").read_text())
    changed_copy(model_directory, tmp_path, "config.json", json.dumps({**config, **change}).encode())
    with pytest.raises(LlamaChatError) as refused:
        load_hf_directory(tmp_path)
    assert str(refused.value).startswith(f"{tmp_path / 'config.json'}: {message}")


def test_a_chat_template_list_of_odd_entries_is_read_for_its_default(model_directory, tmp_path):
    templates = [{"name": {"not": "a name"}, "template": "x"}, "stray", {"name": "default", "template": TEMPLATE}]
    contents = json.dumps({"eos_token": "<|eot_id|>", "chat_template": templates}).encode()
    checkpoint = load_hf_directory(changed_copy(model_directory, tmp_path, "tokenizer_config.json", contents))
    assert checkpoint.chat_template == TEMPLATE


@pytest.mark.parametrize("shard", ["../model.safetensors", "/etc/hostname", 7])
def test_a_weight_index_naming_files_elsewhere_is_refused(model_directory, tmp_path, shard):
    changed_copy(model_directory, tmp_path, "config.json", (model_directory / "config.json").read_bytes())
    write_json(tmp_path / "model.safetensors.index.json", {"weight_map": {"model.norm.weight": shard}})
    with pytest.raises(LlamaChatError) as refused:
        load_hf_directory(tmp_path)
    assert str(refused.value) == (f"{tmp_path / 'model.safetensors.index.json'}: its weight_map names {shard!r}, "
                                  f"not a file in {tmp_path}")


def safetensors_bytes(header: object, data: bytes = bytes(64), length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


TENSOR = {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}


@pytest.mark.parametrize("contents, reason", [
    (safetensors_bytes({"w": TENSOR}, length=2**40), "a header of 1099511627776 bytes in a file of"),
    (b"\x05\x00", "it is shorter than a header"),
    (safetensors_bytes([TENSOR]), "its header is not an object"),
    (safetensors_bytes({"w": [TENSOR]}), "tensor 'w' is described by [{'dtype': 'F32', 'shape': [4, 4], 'd..."),
    (safetensors_bytes({"w": {**TENSOR, "dtype": "Q9"}}), "tensor 'w' has dtype 'Q9'"),
    (safetensors_bytes({"w": {**TENSOR, "dtype": ["F32"]}}), "tensor 'w' has dtype ['F32']"),
    (safetensors_bytes({"w": {**TENSOR, "shape": "4x4"}}), "tensor 'w' has shape '4x4'"),
    (safetensors_bytes({"w": {**TENSOR, "shape": [-4, -4]}}), "tensor 'w' has shape [-4, -4]"),
    (safetensors_bytes({"w": {**TENSOR, "data_offsets": [-64, 0]}}), "tensor 'w' has data_offsets [-64, 0]"),
    (safetensors_bytes({"w": {**TENSOR, "data_offsets": ["0", "64"]}}), "tensor 'w' has data_offsets ['0', '64']"),
    (safetensors_bytes({"w": {**TENSOR, "data_offsets": [0, 32]}}), "tensor 'w' has 32 bytes for shape [4, 4] of F32"),
    # 2**62 * 4 float32s is 2**66 bytes: an int64 product wraps to 0.
    (safetensors_bytes({"w": {**TENSOR, "shape": [2**62, 4], "data_offsets": [0, 0]}}),
     "tensor 'w' has 0 bytes for shape [4611686018427387904, 4] of F32"),
    (safetensors_bytes({"w": {**TENSOR, "data_offsets": [64, 128]}}), "its tensors need 128 bytes of data, the file holds 64"),
    (safetensors_bytes({"w": TENSOR, "v": {**TENSOR, "shape": [2, 4], "data_offsets": [16, 48]}}),
     "tensor 'v' overlaps another"),
    (safetensors_bytes({"__metadata__": {"format": 1}, "w": TENSOR}), "its __metadata__ is not an object of strings"),
    (struct.pack("<Q", 400_000) + b"[" * 200_000 + b"]" * 200_000, "nested more than 64 levels deep"),
])
def test_a_hostile_safetensors_header_is_one_line_naming_the_file(tmp_path, contents, reason):
    path = tmp_path / "model.safetensors"
    path.write_bytes(contents)
    with pytest.raises(LlamaChatError) as refused:
        SafetensorsFile(path)
    assert str(refused.value).startswith(f"{path}: not a readable safetensors file ({reason}")


def test_a_chat_template_file_that_is_not_text_is_one_line(model_directory, tmp_path):
    changed_copy(model_directory, tmp_path, "tokenizer_config.json", json.dumps({"eos_token": "<|eot_id|>"}).encode())
    (tmp_path / "chat_template.jinja").write_bytes(b"{{ messages }}\xff")
    with pytest.raises(LlamaChatError) as refused:
        load_hf_directory(tmp_path)
    assert str(refused.value) == f"{tmp_path / 'chat_template.jinja'}: not UTF-8 text"

