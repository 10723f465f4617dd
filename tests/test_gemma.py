"""Gemma 2 and 3: a GELU gate, norms before and after each sublayer (stored as 1 + w in GGUF,
as w in Hugging Face folders), embeddings scaled by sqrt(dim), per-head q and k norms
(Gemma 3), windowed layers with their own rotation and a ring in the cache, soft caps
(Gemma 2); from folders and from GGUF files as llama.cpp's converter writes them, against
transformers' own classes, through every path llama-chat has."""

import json
import math

import gguf
import pytest
import torch
import torch.multiprocessing as mp
from gguf import GGMLQuantizationType as QType
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

import llama_chat
from llama_chat.checkpoints.gguf import load_gguf
from llama_chat.checkpoints.hf import load_hf_directory
from llama_chat.checkpoints.hf_writer import write_hf_directory
from llama_chat.engine.cache import TRIM_MARGIN
from llama_chat.errors import LlamaChatError

from . import parallel_ranks
from .hf_reference import hf_logits, llama_from_checkpoint
from .test_descendants import (
    assert_a_saved_conversation_resumes,
    assert_drafts_keep_the_greedy_reply,
    compiled_and_eager,
    packed_and_mapped_again,
    train_to_recite,
)
from .test_gguf import VOCAB as GGUF_VOCAB
from .test_hf_checkpoint import BOS, EOT, VOCAB, write_json, write_tokenizer_json
from .test_hf_tokenizer import byte_level_metadata
from .test_tensor_parallel import rendezvous_store

WINDOW = 16
IDS = [BOS] + [(37 * i) % 290 + 5 for i in range(63)]  # 64 positions: four windows
SHAPES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-6,
              bos_token_id=BOS, eos_token_id=EOT, pad_token_id=None, sliding_window=WINDOW,
              query_pre_attn_scalar=24)
KINDS = {
    # Caps low enough to bite on a random model's scores and logits.
    "gemma2": lambda **shapes: Gemma2ForCausalLM(Gemma2Config(
        **{"attn_logit_softcapping": 3.0, "final_logit_softcapping": 2.5, **shapes})),
    # A global rotation of its own (scaled, another base) beside the local one; a layer pattern
    # that is not Gemma's default.
    "gemma3": lambda **shapes: Gemma3ForCausalLM(Gemma3TextConfig(**{
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        **shapes})),
}


def gemma(kind: str, seed: int = 5, **shapes):
    """A random model of transformers' class for `kind`, at a scale that gives lively logits
    (norms near 0, as Gemma keeps them: applied as 1 + w)."""
    model = KINDS[kind](**{**SHAPES, **shapes}).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.ndim == 1:
                parameter.copy_(0.1 * noise)
            elif name.endswith("embed_tokens.weight"):
                parameter.copy_(noise / math.sqrt(parameter.shape[1]))  # scaled up by sqrt(dim) in the model
            else:
                parameter.copy_(noise / math.sqrt(parameter.shape[1]))
    return model


def save_gemma(directory, kind: str, seed: int = 5, model=None):
    """gemma(kind), saved with a tokenizer as a Hugging Face folder."""
    model = model or gemma(kind, seed)
    model.save_pretrained(directory)
    write_tokenizer_json(directory)
    write_json(directory / "tokenizer_config.json", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    return model


def cached_logits(model, ids, capacity):
    """Logits at every position fed through a cache of `capacity`: a prompt chunk, single
    tokens, then a verify-sized call."""
    cache = model.new_cache(capacity)
    third = len(ids) // 3
    steps = [model.runner(cache, ids[:third], every_logits=True)]
    steps += [model.runner(cache, [token], every_logits=True) for token in ids[third : 2 * third]]
    steps.append(model.runner(cache, ids[2 * third :], every_logits=True))
    assert cache.tokens == list(ids)
    return torch.cat(steps)


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_a_gemma_folder_gives_transformers_logits_through_caches_shorter_and_longer_than_the_window(tmp_path, kind):
    model = save_gemma(tmp_path, kind)
    checkpoint = load_hf_directory(tmp_path)
    args = checkpoint.args
    assert args.architecture == kind and args.tie_embeddings and args.sandwich_norms and args.gelu_feed_forward
    assert args.qk_norm == (kind == "gemma3") and args.sliding_window == WINDOW
    assert args.windowed_layers == ((True, False) * 2 if kind == "gemma2" else (True, False, True, True))
    assert args.attention_scale == 24**-0.5 and args.embedding_scale == 8.0
    assert (args.attention_softcap, args.logit_softcap) == ((3.0, 2.5) if kind == "gemma2" else (None, None))
    assert args.local_rope_theta == (1e4 if kind == "gemma3" else None)
    ours = llama_from_checkpoint(checkpoint)
    reference = hf_logits(model, IDS)
    torch.testing.assert_close(ours.logits(IDS), reference, atol=1e-4, rtol=0)
    # A context shorter than the window; one whose ring is the whole context; one whose ring turns over.
    for capacity, ids in ((12, IDS[:12]), (40, IDS[:40]), (80, IDS)):
        expected = reference[: len(ids)] if len(ids) == len(IDS) else hf_logits(model, ids)
        torch.testing.assert_close(cached_logits(ours, ids, capacity), expected, atol=1e-4, rtol=0)


def test_the_window_and_the_caps_change_what_gemma_computes(tmp_path):
    """The reference would agree with a model that ignored them only by accident: each one
    moves transformers' own logits."""
    whole = hf_logits(gemma("gemma2"), IDS)
    for change in ({"sliding_window": 128}, {"attn_logit_softcapping": None}, {"final_logit_softcapping": None}):
        model = Gemma2ForCausalLM(Gemma2Config(**{**SHAPES, "attn_logit_softcapping": 3.0,
                                                  "final_logit_softcapping": 2.5, **change})).eval()
        model.load_state_dict(gemma("gemma2").state_dict())
        assert (hf_logits(model, IDS) - whole).abs().max() > 0.05, change


def to_gguf_name(name: str) -> str | None:
    """A Gemma tensor's name in llama.cpp's files."""
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    layer, _, rest = name.removeprefix("model.layers.").partition(".")
    return f"blk.{layer}.{parts[rest.removesuffix('.weight')]}.weight"


def write_gemma_gguf(path, model, kind: str, qtype: QType = QType.F32, keys=None, windowed_keys: bool = True):
    """A GGUF file of a Gemma model as llama.cpp's converter writes it: norms stored as 1 + w,
    q and k rows as they are, the window and caps among the keys (`keys` adds or replaces
    keys, by their name under the architecture)."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), kind)
    values = {
        "block_count": config.num_hidden_layers, "context_length": config.max_position_embeddings,
        "embedding_length": config.hidden_size, "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads, "attention.head_count_kv": config.num_key_value_heads,
        "attention.layer_norm_rms_epsilon": config.rms_norm_eps, "attention.key_length": config.head_dim,
        "attention.value_length": config.head_dim,
        "rope.freq_base": config.rope_parameters.get("full_attention", config.rope_parameters)["rope_theta"],
    }
    if windowed_keys:
        values["attention.sliding_window"] = config.sliding_window
    if kind == "gemma2":
        values.update({"attn_logit_softcapping": config.attn_logit_softcapping,
                       "final_logit_softcapping": config.final_logit_softcapping})
    values.update(keys or {})
    for key, value in values.items():
        if isinstance(value, list):
            writer.add_array(f"{kind}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{kind}.{key}", value)
        else:
            writer.add_uint32(f"{kind}.{key}", value)
    for key, value in byte_level_metadata(pre="qwen2").items():
        adders = {"model": writer.add_tokenizer_model, "pre": writer.add_tokenizer_pre,
                  "tokens": writer.add_token_list, "token_type": writer.add_token_types,
                  "merges": writer.add_token_merges, "bos_token_id": writer.add_bos_token_id,
                  "eos_token_id": writer.add_eos_token_id}
        adders[key.removeprefix("tokenizer.ggml.")](value)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied: the file holds the embedding only
        array = tensor.detach().float().numpy()
        if name.endswith("norm.weight"):
            writer.add_tensor(to_gguf_name(name), array + 1)  # as llama.cpp's converter stores Gemma's norms
        elif qtype == QType.F32:
            writer.add_tensor(to_gguf_name(name), array)
        else:
            data = gguf.quants.quantize(array, qtype)
            writer.add_tensor(to_gguf_name(name), data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


GGUF_IDS = [(37 * i) % 260 + 3 for i in range(64)]


def gguf_gemma(kind: str, seed: int = 5):
    """A model llama.cpp's files can describe: scores scaled by the head's size, Gemma 3's
    layers in its default pattern and its global rotation unscaled."""
    shapes = dict(vocab_size=len(GGUF_VOCAB), query_pre_attn_scalar=32)
    if kind == "gemma3":
        shapes.update(num_hidden_layers=6, layer_types=None,
                      rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    return gemma(kind, seed, **shapes)


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_a_gemma_gguf_as_llama_cpp_writes_it_gives_transformers_logits(tmp_path, kind):
    model = gguf_gemma(kind)
    reference = hf_logits(model, GGUF_IDS)
    checkpoint = load_gguf(write_gemma_gguf(tmp_path / "f32.gguf", model, kind))
    args = checkpoint.args
    expected_windows = (True, False) * 2 if kind == "gemma2" else (True,) * 5 + (False,)
    assert args.windowed_layers == expected_windows and args.sliding_window == WINDOW
    assert args.local_rope_theta == (1e4 if kind == "gemma3" else None)
    ours = llama_from_checkpoint(checkpoint)
    torch.testing.assert_close(ours.logits(GGUF_IDS), reference, atol=1e-4, rtol=0)
    torch.testing.assert_close(cached_logits(ours, GGUF_IDS, 80), reference, atol=1e-4, rtol=0)


def test_a_gemma3_gguf_may_list_its_windowed_layers(tmp_path):
    model = gguf_gemma("gemma3")
    pattern = [True, False, True, True, False, True]
    path = write_gemma_gguf(tmp_path / "m.gguf", model, "gemma3", keys={"attention.sliding_window_pattern": pattern})
    assert load_gguf(path).args.windowed_layers == tuple(pattern)
    plain = write_gemma_gguf(tmp_path / "global.gguf", model, "gemma3", windowed_keys=False)
    assert load_gguf(plain).args.windowed_layers == ()  # no window: every layer global, as llama.cpp reads it


@pytest.mark.parametrize("keys, message", [
    ({"attention.sliding_window": 0}, "gemma3.attention.sliding_window is 0, where a positive number of positions"),
    ({"attention.sliding_window": 4096},
     "the sliding window of 4096 positions is larger than the model's context of 128"),
    ({"final_logit_softcapping": 0.0}, "gemma3.final_logit_softcapping is 0.0, where a positive number belongs"),
    ({"final_logit_softcapping": math.nan}, "gemma3.final_logit_softcapping is nan, where a number belongs"),
    ({"attention.sliding_window_pattern": [True, False]},
     "gemma3.attention.sliding_window_pattern lists 2 entries for 6 layers"),
    ({"attention.sliding_window_pattern": 0}, "gemma3.attention.sliding_window_pattern is 0"),
    ({"rope.freq_base_swa": -1.0}, "gemma3.rope.freq_base_swa is -1.0, where a positive number belongs"),
])
def test_a_hostile_gemma_header_is_one_line(tmp_path, keys, message):
    path = write_gemma_gguf(tmp_path / "m.gguf", gguf_gemma("gemma3"), "gemma3", keys=keys)
    with pytest.raises(LlamaChatError) as refused:
        load_gguf(path)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_hostile_gemma2_cap_is_one_line(tmp_path):
    path = write_gemma_gguf(tmp_path / "m.gguf", gguf_gemma("gemma2"), "gemma2", keys={"attn_logit_softcapping": 0.0})
    with pytest.raises(LlamaChatError, match="gemma2.attn_logit_softcapping is 0.0, where a positive number belongs"):
        load_gguf(path)


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types must list sliding_attention or full_attention for each"),
    ({"layer_types": ["sliding_attention", "chunked_attention"] * 2}, "layer_types must list"),
    ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar is 0, where a positive number belongs"),
    ({"sliding_window": 0}, "sliding_window is 0, where a positive whole number belongs"),
    ({"sliding_window": 4096}, "the sliding window of 4096 positions is larger than the model's context of 128"),
    ({"final_logit_softcapping": 0}, "final_logit_softcapping is 0, where a positive number belongs"),
    ({"hidden_activation": "relu"}, "activation 'relu' is not supported"),
    ({"use_bidirectional_attention": True}, "bidirectional attention are not supported"),
])
def test_a_hostile_gemma_config_is_one_line(tmp_path, change, message):
    save_gemma(tmp_path, "gemma3")
    config = json.loads((tmp_path / "config.json").read_text())
    write_json(tmp_path / "config.json", {**config, **change})
    with pytest.raises(LlamaChatError) as refused:
        load_hf_directory(tmp_path)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_multimodal_gemma3_folder_is_refused_by_name(tmp_path):
    write_json(tmp_path / "config.json", {"model_type": "gemma3", "text_config": {"hidden_size": 64}})
    with pytest.raises(LlamaChatError, match="a Gemma 3 folder with its vision model"):
        load_hf_directory(tmp_path)


def trained_gemma(directory, kind: str):
    """gemma(kind) trained until it recites IDS, saved as a Hugging Face folder (Gemma 2 with
    Gemma 2's own caps: the tests' low ones would keep it from peaked logits)."""
    model = gemma(kind, **({"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0} if kind == "gemma2"
                           else {}))
    loss = train_to_recite(model, IDS)
    save_gemma(directory, kind, model=model)
    return loss


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_a_trained_gemma_packed_agrees_with_the_exact_path_on_top_1(tmp_path, kind):
    assert trained_gemma(tmp_path, kind) < 0.5
    exact = llama_chat.load(tmp_path, device="cpu", quantize="none")
    packed = llama_chat.load(tmp_path, device="cpu")
    assert packed.weights.packed
    chosen = {name: cached_logits(model, IDS, 80).argmax(-1) for name, model in (("exact", exact), ("packed", packed))}
    assert (chosen["exact"] == chosen["packed"]).float().mean() >= 0.98


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_gemma_speculates_and_resumes_as_llama_does(tmp_path, kind):
    """Packed, mapped again from the packed cache: prompt-lookup drafts past the window leave
    the greedy reply as it was; a conversation saved with its windowed cache and opened again
    continues as the unbroken one."""
    save_gemma(tmp_path / "model", kind)
    model = packed_and_mapped_again(tmp_path / "model")
    assert_drafts_keep_the_greedy_reply(model, IDS[:20] * 2, 40)
    session = assert_a_saved_conversation_resumes(model, tmp_path, [
        "the first message, long enough to fill the window of sixteen positions",
        "and a second one, so that the ring turns over"])
    assert len(session.cache) > WINDOW + TRIM_MARGIN  # the rings held the last positions only


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_gemma_resaved_by_convert_reads_back_the_same(tmp_path, kind):
    model = save_gemma(tmp_path / kind, kind)
    checkpoint = load_hf_directory(tmp_path / kind)
    write_hf_directory(checkpoint, tmp_path / "again", torch.float32)
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert config["model_type"] == {"gemma2": "gemma2", "gemma3": "gemma3_text"}[kind]
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "again", dtype=torch.float32).eval()
    torch.testing.assert_close(hf_logits(theirs, IDS), hf_logits(model, IDS), atol=1e-5, rtol=0)


@pytest.mark.needs_compiler
def test_gemmas_compiled_packages_agree_with_its_eager_calls_past_the_window(tmp_path):
    save_gemma(tmp_path, "gemma3")
    compiled_logits, eager_logits = compiled_and_eager(llama_chat.load(tmp_path, device="cpu"), tmp_path, IDS, 50)
    torch.testing.assert_close(compiled_logits, eager_logits, atol=1e-3, rtol=0)


def test_a_gemma_group_of_two_ranks_reproduces_one_process(tmp_path):
    """Each rank holds one of the two key/value heads and its windowed layers' rings; logits,
    a greedy reply past the window and a conversation of three turns as in one process."""
    path = write_gemma_gguf(tmp_path / "gemma.gguf", gguf_gemma("gemma3"), "gemma3")
    alone = parallel_ranks.run_alone(str(path))
    store = rendezvous_store()
    mp.start_processes(parallel_ranks.run, args=(2, store.port, str(path), str(tmp_path)), nprocs=2,
                       start_method="spawn")
    group = torch.load(tmp_path / "rank0.pt")
    assert torch.allclose(group["logits"], alone["logits"], atol=1e-4, rtol=0)
    assert group["greedy"] == alone["greedy"] and len(group["greedy"]) > WINDOW
    assert group["turns"] == alone["turns"] and all(group["turns"])
    assert group["shapes"]["layers.0.attention.wqkv.weight"] == [(4 + 2 * 2) * 32 // 2, 64]
