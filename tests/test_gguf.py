"""GGUF checkpoints: tiny random models written with gguf.GGUFWriter, checked against transformers."""

import math
import re
import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat import Llama
from llama_chat.checkpoints.gguf import load_gguf
from llama_chat.checkpoints.gguf_file import read_gguf_header
from llama_chat.engine.model import Transformer
from llama_chat.errors import LlamaChatError
from llama_chat.model_info import model_info

from .hf_reference import hf_logits, random_hf_model
from .test_hf_tokenizer import byte_level_metadata, spm_metadata, train_sentencepiece

CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
VOCAB = byte_level_metadata(pre="smollm")["tokenizer.ggml.tokens"]
IDS = [1, 70, 80, 90, 100, 261, 262, 3, 4, 200, 150, 2, 5, 6, 7, 8, 9, 10, 260, 259]


def tiny_hf_model(seed: int = 0, **config):
    """Dimensions that are multiples of 32, as block-quantised types need."""
    settings = dict(
        vocab_size=len(VOCAB), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )
    settings.update(config)
    return random_hf_model(seed, **settings)


def to_interleaved(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to q and k rows: within each head, the two halves
    of the Hugging Face layout become interleaved pairs."""
    rows, columns = weight.shape
    return weight.reshape(n_heads, 2, rows // n_heads // 2, columns).swapaxes(1, 2).reshape(rows, columns)


def llama3_rope_factors(config: dict, head_dim: int) -> np.ndarray:
    """The rope_freqs tensor llama.cpp writes for Llama 3.1 rope scaling."""
    scaling = config["rope_parameters"]
    inv_freq = 1.0 / scaling["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
    old_context = scaling["original_max_position_embeddings"]
    low, high, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
    factors = []
    for frequency in inv_freq:
        wavelength = 2 * math.pi / frequency
        if wavelength < old_context / high:
            factors.append(1.0)
        elif wavelength > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(
    path: Path,
    model,
    *,
    qtype: QType = QType.F32,
    architecture: str = "llama",
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
    vocabulary: dict | None = None,
    chat_template: str = CHAT_TEMPLATE,
) -> Path:
    """A GGUF file of a transformers LlamaForCausalLM (or Qwen2/Qwen3/Granite/Phi3ForCausalLM,
    under their architecture's name), laid out as llama.cpp's converter does.

    `vocabulary` is tokenizer.ggml.* metadata (by default a byte-level one with the smollm split).
    """
    config = model.config.to_dict()
    n_heads, n_kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // n_heads
    descendant = architecture in ("qwen2", "qwen3", "phi3")  # q/k rows kept as they are (rotating halves)
    rotary_dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_rope_dimension_count(rotary_dim)
    if descendant:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_chat_template(chat_template)
    adders = {
        "model": writer.add_tokenizer_model, "pre": writer.add_tokenizer_pre, "tokens": writer.add_token_list,
        "token_type": writer.add_token_types, "merges": writer.add_token_merges, "scores": writer.add_token_scores,
        "bos_token_id": writer.add_bos_token_id, "eos_token_id": writer.add_eos_token_id,
        "unknown_token_id": writer.add_unk_token_id, "add_space_prefix": writer.add_add_space_prefix,
    }
    for key, value in (vocabulary or byte_level_metadata(pre="smollm")).items():
        adders[key.removeprefix("tokenizer.ggml.")](value)
    if extra is not None:
        extra(writer)
    rope = config["rope_parameters"]
    if rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config, head_dim))
    if rope.get("rope_type") == "longrope":  # Phi-3's factors and attention factor
        original = rope["original_max_position_embeddings"]
        scale = config["max_position_embeddings"] / original
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))

    def add(name: str, tensor: torch.Tensor) -> None:
        array = tensor.detach().float().numpy()
        if array.ndim == 1 or qtype == QType.F32:
            writer.add_tensor(name, array)  # norms stay F32, as llama.cpp keeps them
        else:
            data = gguf.quants.quantize(array, qtype)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    weights = model.state_dict()
    add("token_embd.weight", weights["model.embed_tokens.weight"])
    add("output_norm.weight", weights["model.norm.weight"])
    if not config["tie_word_embeddings"]:
        add("output.weight", weights["lm_head.weight"])
    for i in range(config["num_hidden_layers"]):
        hf = f"model.layers.{i}."
        if hf + "self_attn.qkv_proj.weight" in weights:  # Phi-3: one tensor each, as the checkpoint has them
            add(f"blk.{i}.attn_qkv.weight", weights[hf + "self_attn.qkv_proj.weight"])
            add(f"blk.{i}.ffn_up.weight", weights[hf + "mlp.gate_up_proj.weight"])
            for ours, theirs in (("attn_output", "self_attn.o_proj"), ("ffn_down", "mlp.down_proj"),
                                 ("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm")):
                add(f"blk.{i}.{ours}.weight", weights[hf + theirs + ".weight"])
            continue
        q, k = weights[hf + "self_attn.q_proj.weight"], weights[hf + "self_attn.k_proj.weight"]
        if not descendant:
            q = torch.from_numpy(to_interleaved(q.numpy(), n_heads))
            k = torch.from_numpy(to_interleaved(k.numpy(), n_kv_heads))
        add(f"blk.{i}.attn_q.weight", q)
        add(f"blk.{i}.attn_k.weight", k)
        for part in ("q", "k", "v"):
            if hf + f"self_attn.{part}_proj.bias" in weights:
                add(f"blk.{i}.attn_{part}.bias", weights[hf + f"self_attn.{part}_proj.bias"])
        for part in ("q", "k"):
            if hf + f"self_attn.{part}_norm.weight" in weights:
                add(f"blk.{i}.attn_{part}_norm.weight", weights[hf + f"self_attn.{part}_norm.weight"])
        add(f"blk.{i}.attn_v.weight", weights[hf + "self_attn.v_proj.weight"])
        add(f"blk.{i}.attn_output.weight", weights[hf + "self_attn.o_proj.weight"])
        add(f"blk.{i}.ffn_gate.weight", weights[hf + "mlp.gate_proj.weight"])
        add(f"blk.{i}.ffn_up.weight", weights[hf + "mlp.up_proj.weight"])
        add(f"blk.{i}.ffn_down.weight", weights[hf + "mlp.down_proj.weight"])
        add(f"blk.{i}.attn_norm.weight", weights[hf + "input_layernorm.weight"])
        add(f"blk.{i}.ffn_norm.weight", weights[hf + "post_attention_layernorm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_from_gguf(path: Path) -> Llama:
    checkpoint = load_gguf(path)
    transformer = Transformer(checkpoint.args)
    transformer.load_state_dict(checkpoint.state_dict(), strict=True)
    return Llama(transformer, checkpoint.tokenizer)


def quantized_copy(model, qtype: QType):
    """The model with every matrix replaced by its quantise-dequantise round trip."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                rounded = gguf.quants.dequantize(gguf.quants.quantize(parameter.numpy(), qtype), qtype)
                parameter.copy_(torch.from_numpy(rounded))
    return model


# --- weights and logits -----------------------------------------------------------------


def test_f32_gguf_matches_transformers(tmp_path):
    model = tiny_hf_model(seed=1)
    ours = llama_from_gguf(write_gguf(tmp_path / "m.gguf", model))
    args = ours.args
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.head_dim) == (64, 2, 4, 2, 16)
    assert (args.hidden_dim, args.vocab_size, args.max_seq_len) == (96, len(VOCAB), 128)
    assert not args.tie_embeddings
    assert args.norm_eps == pytest.approx(1e-5) and args.rope_theta == 10000.0
    torch.testing.assert_close(ours.logits(IDS), hf_logits(model, IDS), atol=1e-4, rtol=0)


def test_tied_embeddings_when_the_file_has_no_output_tensor(tmp_path):
    model = tiny_hf_model(seed=2, tie_word_embeddings=True, num_key_value_heads=4)
    checkpoint = load_gguf(write_gguf(tmp_path / "m.gguf", model))
    assert checkpoint.args.tie_embeddings
    assert checkpoint.tensors["output.weight"] is checkpoint.tensors["tok_embeddings.weight"]
    ours = llama_from_gguf(tmp_path / "m.gguf")
    torch.testing.assert_close(ours.logits(IDS), hf_logits(model, IDS), atol=1e-4, rtol=0)


def test_q8_0_gguf_loads_exactly_the_dequantised_weights(tmp_path):
    model = tiny_hf_model(seed=3)
    reference = hf_logits(model, IDS)
    ours = llama_from_gguf(write_gguf(tmp_path / "m.gguf", model, qtype=QType.Q8_0)).logits(IDS)
    # Against the same model with Q8_0-rounded weights the only difference is arithmetic order.
    torch.testing.assert_close(ours, hf_logits(quantized_copy(model, QType.Q8_0), IDS), atol=1e-4, rtol=0)
    # Against the float weights, Q8_0 rounding moves these logits (std 1.0) by 0.114 at most
    # and 0.016 on average (measured; 0.09-0.16 and 0.016-0.023 over seeds 0-5). A q/k layout
    # error moves them by 4.2, so these bounds still catch one.
    error = (ours - reference).abs()
    assert error.max() < 0.25 and error.mean() < 0.03


@pytest.mark.parametrize(
    "qtype", [QType.F16, QType.BF16, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1], ids=lambda q: q.name
)
def test_other_types_dequantise_to_their_rounded_weights(tmp_path, qtype):
    model = tiny_hf_model(seed=4)
    ours = llama_from_gguf(write_gguf(tmp_path / "m.gguf", model, qtype=qtype)).logits(IDS)
    torch.testing.assert_close(ours, hf_logits(quantized_copy(model, qtype), IDS), atol=1e-4, rtol=0)


def test_weights_come_back_fused_in_the_requested_dtype(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model(), qtype=QType.Q8_0)
    state = load_gguf(path).state_dict(torch.bfloat16)
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    assert state["layers.1.attention.wqkv.weight"].shape == (64 + 2 * 32, 64)
    assert state["layers.1.feed_forward.w13.weight"].shape == (2 * 96, 64)


# --- rope scaling -------------------------------------------------------------------------


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path):
    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=8.0,
                   original_max_position_embeddings=64, rope_theta=10000.0)
    model = tiny_hf_model(seed=5, rope_parameters=scaling)
    ours = llama_from_gguf(write_gguf(tmp_path / "m.gguf", model))
    recovered = ours.args.rope_scaling
    assert recovered.kind == "llama3" and recovered.factor == pytest.approx(8.0)
    # The file determines the wavelengths where scaling starts and ends (original/low, original/high).
    original = recovered.original_max_position_embeddings
    assert original / recovered.low_freq_factor == pytest.approx(64.0, rel=1e-4)
    assert original / recovered.high_freq_factor == pytest.approx(8.0, rel=1e-4)
    ids = IDS * 5  # positions up to 100, past the original context of 64
    torch.testing.assert_close(ours.logits(ids), hf_logits(model, ids), atol=1e-4, rtol=0)


def test_linear_rope_scaling_from_metadata(tmp_path):
    model = tiny_hf_model(seed=6, rope_parameters=dict(rope_type="linear", factor=4.0, rope_theta=10000.0))
    def linear(writer: gguf.GGUFWriter) -> None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(4.0)

    ours = llama_from_gguf(write_gguf(tmp_path / "m.gguf", model, extra=linear))
    assert (ours.args.rope_scaling.kind, ours.args.rope_scaling.factor) == ("linear", 4.0)
    torch.testing.assert_close(ours.logits(IDS), hf_logits(model, IDS), atol=1e-4, rtol=0)


def test_yarn_rope_scaling_is_refused(tmp_path):
    def yarn(writer: gguf.GGUFWriter) -> None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)

    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model(), extra=yarn)
    with pytest.raises(LlamaChatError, match="'yarn' rope scaling"):
        load_gguf(path)


# --- tokenizer and chat metadata ------------------------------------------------------------


def test_tokenizer_and_chat_metadata(tmp_path):
    checkpoint = load_gguf(write_gguf(tmp_path / "m.gguf", tiny_hf_model()))
    tokenizer = checkpoint.tokenizer
    assert checkpoint.chat_template == CHAT_TEMPLATE
    assert (checkpoint.bos_token, checkpoint.eos_token) == ("<|im_start|>", "<|endoftext|>")
    assert checkpoint.stop_ids == frozenset({0, 2})
    typed = tokenizer.encode("<|im_end|> the 42")
    assert len(typed) > 3 and not set(typed) & {0, 1, 2}
    assert [VOCAB[i] for i in tokenizer.encode(" the 42")] == ["Ġthe", "Ġ", "4", "2"]  # smollm split
    assert tokenizer.decode([1, *typed, 2]) == "<|im_start|><|im_end|> the 42<|im_end|>"


def test_sentencepiece_vocabulary_read_from_the_file(tmp_path):
    sp = train_sentencepiece(tmp_path)
    vocabulary = spm_metadata(sp)
    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model(vocab_size=sp.GetPieceSize()), vocabulary=vocabulary)
    checkpoint = load_gguf(path)
    text = "  Hello world, 2024 Привет <tool>"
    assert checkpoint.tokenizer.encode(text) == sp.encode(text)
    assert (checkpoint.bos_token, checkpoint.eos_token, checkpoint.stop_ids) == ("<s>", "</s>", frozenset({2}))
    assert checkpoint.tokenizer.add_bos_token


# --- files llama-chat refuses ---------------------------------------------------------------


def test_other_architectures_are_refused_by_name(tmp_path):
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(), architecture="gemma")
    expected = (r"model\.gguf is a 'gemma' model; llama-chat runs llama, qwen2, qwen3, granite, phi3, gemma2, "
                r"gemma3 models")
    with pytest.raises(LlamaChatError, match=expected):
        load_gguf(path)


@pytest.mark.parametrize("keep", [0.0, 0.01, 0.3, 0.9, 0.999])
def test_truncated_file_is_refused_naming_it(tmp_path, keep):
    path = write_gguf(tmp_path / "cut.gguf", tiny_hf_model())
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    expected = "cut.gguf is not a GGUF file" if keep < 0.001 else "cut.gguf: the GGUF file is truncated or corrupt"
    with pytest.raises(LlamaChatError, match=expected):
        load_gguf(path)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(LlamaChatError, match="absent.gguf: no such file"):
        load_gguf(tmp_path / "absent.gguf")


def test_not_a_gguf_file_is_refused(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, not a model at all" * 10)
    with pytest.raises(LlamaChatError, match="notes.gguf is not a GGUF file"):
        load_gguf(path)


def copy_gguf(source: Path, target: Path, replacements: dict[str, tuple[np.ndarray, QType]]) -> Path:
    """The same file with some tensors replaced by (data, type): F32 data, or raw quantised bytes."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(target), "llama")
    for field in reader.fields.values():
        if not field.name.startswith(("GGUF.", "general.architecture")):
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        data, qtype = replacements.get(tensor.name, (np.array(tensor.data), tensor.tensor_type))
        writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def test_k_quant_tensor_is_dequantised_in_place(tmp_path):
    # gguf-py cannot quantise to K-quants, so make Q6_K blocks by hand: 128 bytes of low
    # bits, 64 of high bits, 16 int8 scales and a float16 scale for 256 weights each.
    model = tiny_hf_model(hidden_size=256, intermediate_size=256)
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(len(VOCAB), 210), dtype=np.uint8)
    blocks[:, 208:] = np.full((len(VOCAB), 1), 0.01, dtype=np.float16).view(np.uint8)
    source = write_gguf(tmp_path / "m.gguf", model)
    path = copy_gguf(source, tmp_path / "q6k.gguf", {"token_embd.weight": (blocks, QType.Q6_K)})
    embedding = load_gguf(path).tensors["tok_embeddings.weight"].dense()
    expected = torch.from_numpy(gguf.quants.dequantize(blocks, QType.Q6_K))
    assert embedding.shape == (len(VOCAB), 256)
    torch.testing.assert_close(embedding, expected, atol=0, rtol=0)


def test_unsupported_tensor_type_is_refused(tmp_path):
    source = write_gguf(tmp_path / "m.gguf", tiny_hf_model())
    wide = np.zeros((96, 64), dtype=np.float64)
    path = copy_gguf(source, tmp_path / "f64.gguf", {"blk.0.ffn_up.weight": (wide, QType.F64)})
    with pytest.raises(LlamaChatError, match="blk.0.ffn_up.weight is stored as F64"):
        load_gguf(path)


def test_shape_that_disagrees_with_metadata_is_refused(tmp_path):
    def wider_feed_forward(writer: gguf.GGUFWriter) -> None:
        writer.add_feed_forward_length(128)  # the later value replaces the true 96

    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model(), extra=wider_feed_forward)
    with pytest.raises(LlamaChatError, match=r"blk.0.ffn_gate.weight has shape \[96, 64\], expected \[128, 64\]"):
        load_gguf(path)


def test_sampling_keys_are_the_models_recommendation(tmp_path):
    """llama.cpp's general.sampling.* keys, in SamplingSettings' names; others ignored."""

    def sampling(writer):
        writer.add_float32("general.sampling.temp", 0.15)
        writer.add_int32("general.sampling.top_k", 30)
        writer.add_float32("general.sampling.top_p", 0.8)
        writer.add_float32("general.sampling.min_p", 0.02)
        writer.add_float32("general.sampling.penalty_repeat", 1.05)
        writer.add_int32("general.sampling.penalty_last_n", 128)
        writer.add_int32("general.sampling.mirostat", 2)

    path = write_gguf(tmp_path / "sampling.gguf", tiny_hf_model(seed=1), extra=sampling)
    settings = load_gguf(path).sampling
    assert settings.keys() == {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n"}
    # The float32s the file stores, as the decimals written (0.15, not 0.15000000596046448).
    assert settings == {"temperature": 0.15, "top_k": 30, "top_p": 0.8, "min_p": 0.02, "repeat_penalty": 1.05,
                        "repeat_last_n": 128}
    assert load_gguf(write_gguf(tmp_path / "plain.gguf", tiny_hf_model(seed=1))).sampling == {}


# --- headers written by hand: whatever they say, one line naming the file ----------------


def gguf_text(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf_entry(key: str, value_type: int, payload: bytes) -> bytes:
    return gguf_text(key) + struct.pack("<I", value_type) + payload


def gguf_tensor(name: str, dimensions: list[int], tensor_type: int = 0, offset: int = 0) -> bytes:
    return (gguf_text(name) + struct.pack(f"<I{len(dimensions)}Q", len(dimensions), *dimensions)
            + struct.pack("<IQ", tensor_type, offset))


def raw_gguf(path: Path, entries=(), tensors=(), version: int = 3, counts: tuple[int, int] | None = None) -> Path:
    """A GGUF file of hand-made metadata entries and tensor infos (each as bytes) and 64
    bytes of data; `counts` overrides the numbers of tensors and entries the header states."""
    tensor_count, entry_count = counts or (len(tensors), len(entries))
    header = b"GGUF" + struct.pack("<IQQ", version, tensor_count, entry_count)
    path.write_bytes(header + b"".join(entries) + b"".join(tensors) + bytes(64))
    return path


U8, U32, F32_VALUE, STRING_VALUE, ARRAY_VALUE, U64 = 0, 4, 6, 8, 9, 10
HOSTILE_HEADERS = {
    "nested arrays": (
        [gguf_entry("deep", ARRAY_VALUE, struct.pack("<IQ", ARRAY_VALUE, 1) * 200_000 + struct.pack("<IQ", U32, 0))],
        [], "metadata arrays nested more than 4 deep"),
    "alignment 0": ([gguf_entry("general.alignment", U32, struct.pack("<I", 0))], [],
                    "general.alignment is 0, not a power of two up to 1048576"),
    "alignment 48": ([gguf_entry("general.alignment", U32, struct.pack("<I", 48))], [],
                     "general.alignment is 48, not a power of two up to 1048576"),
    "alignment 2**40": ([gguf_entry("general.alignment", U64, struct.pack("<Q", 2**40))], [],
                        "general.alignment is 1099511627776, not a power of two up to 1048576"),
    "alignment text": ([gguf_entry("general.alignment", STRING_VALUE, gguf_text("32"))], [],
                       "general.alignment is '32', not a power of two up to 1048576"),
    # 2**32 * 2**32 float32s: an int64 product wraps to 0 bytes, which fit anywhere.
    "2**64 elements": ([], [gguf_tensor("big.weight", [2**32, 2**32])], "tensor big.weight runs past the end of the file"),
    "a string of 2**40 bytes": (
        [gguf_entry("tokenizer.ggml.tokens", ARRAY_VALUE, struct.pack("<IQQ", STRING_VALUE, 1, 2**40))], [],
        "a string of 1099511627776 bytes"),
    "2**40 array values": ([gguf_entry("huge", ARRAY_VALUE, struct.pack("<IQ", U8, 2**40))], [],
                           "its metadata arrays hold more than 8388608 values"),
    "an array past the end": ([gguf_entry("short", ARRAY_VALUE, struct.pack("<IQ", U32, 1000))], [],
                              "an array runs past the end of the file"),
    "unknown value type": ([gguf_entry("odd", 13, b"")], [], "a metadata value of unknown type 13"),
    "2**31 dimensions": ([], [gguf_text("t") + struct.pack("<I", 2**31)], "tensor t has 2147483648 dimensions"),
    "unknown tensor type": ([], [gguf_tensor("t", [4], tensor_type=99)], "tensor t has unknown type 99"),
    "rows not whole blocks": ([], [gguf_tensor("t", [40, 2], tensor_type=QType.Q4_0)],
                              "tensor t's rows are not whole Q4_0 blocks"),
    "a name that is not one": ([], [gguf_tensor("a\nb", [4])], r"a tensor is named 'a\nb'"),
    "a tensor twice": ([], [gguf_tensor("t", [4]), gguf_tensor("t", [4])], "tensor t is listed twice"),
    "a key twice": ([gguf_entry("llama.context_length", U32, struct.pack("<I", 128)),
                     gguf_entry("llama.context_length", U32, struct.pack("<I", 2**20))], [],
                    "metadata key 'llama.context_length' is listed twice"),
}


@pytest.mark.parametrize("case", list(HOSTILE_HEADERS))
def test_a_hostile_header_is_one_line_naming_the_file(tmp_path, case):
    entries, tensors, reason = HOSTILE_HEADERS[case]
    path = raw_gguf(tmp_path / "hostile.gguf", entries, tensors)
    with pytest.raises(LlamaChatError) as refused:
        load_gguf(path)
    assert str(refused.value) == f"{path}: the GGUF file is truncated or corrupt ({reason}); download it again"


STEPPED = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.scores"})


def test_arrays_stepped_over_are_left_out_and_the_rest_read_alike(tmp_path):
    """What a kept tokenizer makes unneeded is not made into Python values."""
    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model(), vocabulary=byte_level_metadata(
        pre="smollm", **{"tokenizer.ggml.scores": [0.5] * len(VOCAB)}))
    metadata, tensors = read_gguf_header(path)
    stepped_metadata, stepped_tensors = read_gguf_header(path, STEPPED)
    assert STEPPED <= set(metadata) and not STEPPED & set(stepped_metadata)
    assert stepped_metadata == {key: value for key, value in metadata.items() if key not in STEPPED}
    assert stepped_tensors == tensors


@pytest.mark.parametrize("entries, reason", [
    ([gguf_entry("tokenizer.ggml.tokens", ARRAY_VALUE, struct.pack("<IQQ", STRING_VALUE, 1, 2**40))],
     "a string of 1099511627776 bytes"),
    ([gguf_entry("tokenizer.ggml.tokens", ARRAY_VALUE,
                 struct.pack("<IQ", STRING_VALUE, 2) + gguf_text("a") + struct.pack("<Q", 1000))],
     "a string runs past the end of the file"),
    ([gguf_entry("tokenizer.ggml.scores", ARRAY_VALUE, struct.pack("<IQ", F32_VALUE, 1000))],
     "an array runs past the end of the file"),
    ([gguf_entry("tokenizer.ggml.scores", ARRAY_VALUE, struct.pack("<IQ", U8, 2**40))],
     "its metadata arrays hold more than 8388608 values"),
    ([gguf_entry("tokenizer.ggml.tokens", ARRAY_VALUE, struct.pack("<IQ", STRING_VALUE, 0)),
      gguf_entry("tokenizer.ggml.tokens", U32, struct.pack("<I", 1))],
     "metadata key 'tokenizer.ggml.tokens' is listed twice"),
])
def test_arrays_stepped_over_are_checked_as_those_read(tmp_path, entries, reason):
    path = raw_gguf(tmp_path / "hostile.gguf", entries)
    with pytest.raises(LlamaChatError) as refused:
        read_gguf_header(path, STEPPED)
    assert str(refused.value) == f"{path}: the GGUF file is truncated or corrupt ({reason}); download it again"


@pytest.mark.parametrize("version, counts, reason", [
    (99, None, "GGUF version 99, where llama-chat reads 2 and 3"),
    (3, (2**60, 0), "it lists 1152921504606846976 tensors and 0 metadata entries"),
    (3, (0, 2**60), "it lists 0 tensors and 1152921504606846976 metadata entries"),
])
def test_counts_and_versions_are_checked_before_anything_is_read(tmp_path, version, counts, reason):
    path = raw_gguf(tmp_path / "hostile.gguf", version=version, counts=counts)
    with pytest.raises(LlamaChatError, match=re.escape(f"truncated or corrupt ({reason})")):
        load_gguf(path)


@pytest.mark.parametrize("add, message", [
    (lambda w: w.add_uint32("llama.attention.head_count", 0),
     "llama.attention.head_count is 0, where a positive whole number belongs"),
    (lambda w: w.add_string("llama.block_count", "two"),
     "llama.block_count is 'two', where a positive whole number belongs"),
    (lambda w: w.add_float32("llama.feed_forward_length", 96.0),
     "llama.feed_forward_length is 96.0, where a positive whole number belongs"),
    (lambda w: w.add_string("llama.rope.freq_base", "high"), "llama.rope.freq_base is 'high', where a number belongs"),
    (lambda w: (w.add_string("llama.rope.scaling.type", "linear"), w.add_string("llama.rope.scaling.factor", "x")),
     "llama.rope.scaling.factor is 'x', where a number belongs"),
    (lambda w: w.add_uint32("tokenizer.ggml.tokens", 7), "tokenizer.ggml.tokens is 7, where a list belongs"),
    (lambda w: w.add_array("tokenizer.ggml.merges", [1, 2]), "tokenizer.ggml.merges[0] is 1, where text belongs"),
    (lambda w: w.add_string("tokenizer.ggml.bos_token_id", "1"),
     "tokenizer.ggml.bos_token_id is '1', where a whole number belongs"),
    (lambda w: w.add_array("general.architecture", ["llama"]), "general.architecture is ['llama'], where text belongs"),
])
def test_metadata_of_the_wrong_type_is_named(tmp_path, add, message):
    path = write_gguf(tmp_path / "typed.gguf", tiny_hf_model(), extra=add)
    with pytest.raises(LlamaChatError) as refused:
        load_gguf(path)
    assert str(refused.value) == f"{path}: {message}"


def test_a_vocabulary_the_tokenizer_library_refuses_is_one_line(tmp_path):
    def merge_of_unknown_tokens(writer: gguf.GGUFWriter) -> None:
        writer.add_token_merges(["unknown tokens"])

    path = write_gguf(tmp_path / "merges.gguf", tiny_hf_model(), extra=merge_of_unknown_tokens)
    with pytest.raises(LlamaChatError, match=r"merges\.gguf: its tokenizer metadata makes no tokenizer \(.*\)$"):
        load_gguf(path)


# Where a block type keeps its float16 scale d, and a spread for it that keeps weights near
# 1/sqrt(256) (random levels fill the rest).
SCALE_FIELDS = {"Q3_K": (108, 0.002), "IQ4_NL": (0, 0.0002)}


def random_blocks_with_scale(kind: str, rows: int, columns: int, seed: int) -> np.ndarray:
    weights, size = gguf.GGML_QUANT_SIZES[QType[kind]]
    generator = np.random.default_rng(seed)
    raw = generator.integers(0, 256, size=(rows, columns // weights, size), dtype=np.uint8)
    offset, spread = SCALE_FIELDS[kind]
    scales = (generator.standard_normal((rows, columns // weights)) * spread).astype(np.float16)
    raw[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(rows, columns // weights, 2)
    return raw.reshape(rows, -1)


def test_types_our_kernels_do_not_read_are_named_by_info_and_run_as_q8_0(tmp_path):
    """A file whose feed-forward matrices are Q3_K and IQ4_NL (random blocks with sane
    scales): info says what they are read into, and the packed model follows the file's
    float32 reading within the Q8_0 rounding of those matrices."""
    model = tiny_hf_model(seed=4, hidden_size=256, intermediate_size=256)
    path = write_gguf(tmp_path / "f32.gguf", model)
    metadata_path = tmp_path / "mixed.gguf"
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(metadata_path), "llama")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1]
                                 if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for index, tensor in enumerate(reader.tensors):
        kind = {"ffn_down": "Q3_K", "ffn_up": "IQ4_NL"}.get(tensor.name.split(".")[-2])
        if kind is None:
            writer.add_tensor(tensor.name, np.array(tensor.data).reshape([int(d) for d in reversed(tensor.shape)]))
        else:
            rows, columns = int(tensor.shape[1]), int(tensor.shape[0])
            blocks = random_blocks_with_scale(kind, rows, columns, seed=index)
            writer.add_tensor(tensor.name, blocks, raw_shape=blocks.shape, raw_dtype=QType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    rows = dict(model_info(metadata_path))
    assert rows["kernels"] == ("F32 (12 matrices) read into Q8_0 blocks; IQ4_NL (2 matrices) read into Q8_0 blocks; "
                               "Q3_K (2 matrices) read into Q8_0 blocks")
    exact = llama_chat.load(metadata_path, device="cpu", quantize="none")
    packed = llama_chat.load(metadata_path, device="cpu")
    assert packed.weights.packing == "Q8_0"
    reference, logits = exact.logits(IDS), packed.logits(IDS)
    assert (logits - reference).abs().max() < 0.05 * reference.abs().max()
