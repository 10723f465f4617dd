import math

import numpy as np
import pytest
import torch

from llama_chat import Llama
from llama_chat.checkpoints.contents import dense_state_dict
from llama_chat.checkpoints.hf import convert_hf_state_dict
from llama_chat.engine.cache import KVCache
from llama_chat.engine.model import RMSNorm, Transformer
from llama_chat.engine.rope import apply_rotary, rope_tables
from llama_chat.text.tokenizer import ByteTokenizer

from . import numpy_reference
from .conftest import tiny_args
from .hf_reference import hf_logits, llama_from_hf, random_hf_model


def test_rotary_score_depends_only_on_relative_position():
    args = tiny_args(max_seq_len=64)
    cos, sin = rope_tables(args, 64)
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 1, args.head_dim, generator=generator, dtype=torch.float64)
    k = torch.randn(1, 1, 1, args.head_dim, generator=generator, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        rotated_q = apply_rotary(q, cos[m : m + 1].double(), sin[m : m + 1].double())
        rotated_k = apply_rotary(k, cos[n : n + 1].double(), sin[n : n + 1].double())
        return float((rotated_q * rotated_k).sum())

    for distance in (0, 3, 17):
        scores = [score(start + distance, start) for start in (0, 5, 40)]
        assert scores == pytest.approx([scores[0]] * 3, abs=1e-5)
    assert score(10, 0) != pytest.approx(score(20, 0), abs=1e-3)


def test_rms_norm_normalises_each_token_over_features_only():
    norm = RMSNorm(8, eps=1e-6)
    x = torch.randn(1, 5, 8) * torch.arange(1, 6).view(1, 5, 1)  # very different scales per token
    out = norm(x)
    assert torch.allclose(out.pow(2).mean(-1), torch.ones(1, 5), atol=1e-4)
    # A token's output does not depend on the other tokens.
    assert torch.equal(norm(x[:, 2:3]), out[:, 2:3])


def test_later_tokens_never_change_earlier_logits(tiny_model):
    ids = list(range(40, 60))
    changed = list(ids)
    changed[12] = 200
    before, after = tiny_model.logits(ids), tiny_model.logits(changed)
    assert torch.equal(before[:12], after[:12])
    assert not torch.allclose(before[12:], after[12:])


def test_matches_numpy_reference():
    config = dict(n_layers=2, n_heads=6, n_kv_heads=2, head_dim=8, norm_eps=1e-5, rope_theta=10000.0)
    args = tiny_args()
    rng = np.random.default_rng(3)

    def matrix(rows, cols):
        return rng.standard_normal((rows, cols)) / math.sqrt(cols)

    weights = {"model.embed_tokens.weight": rng.standard_normal((args.vocab_size, args.dim))}
    weights["model.norm.weight"] = 1 + 0.1 * rng.standard_normal(args.dim)
    weights["lm_head.weight"] = matrix(args.vocab_size, args.dim)
    for layer in range(args.n_layers):
        p = f"model.layers.{layer}."
        weights[p + "self_attn.q_proj.weight"] = matrix(48, 48)
        weights[p + "self_attn.k_proj.weight"] = matrix(16, 48)
        weights[p + "self_attn.v_proj.weight"] = matrix(16, 48)
        weights[p + "self_attn.o_proj.weight"] = matrix(48, 48)
        weights[p + "mlp.gate_proj.weight"] = matrix(80, 48)
        weights[p + "mlp.up_proj.weight"] = matrix(80, 48)
        weights[p + "mlp.down_proj.weight"] = matrix(48, 80)
        weights[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(48)
        weights[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(48)
    tensors = {k: torch.tensor(v, dtype=torch.float32) for k, v in weights.items()}
    transformer = Transformer(args)
    transformer.load_state_dict(dense_state_dict(convert_hf_state_dict(tensors, args)))
    ids = [5, 100, 42, 7, 250, 13, 13, 99, 0, 64]
    ours = Llama(transformer, ByteTokenizer()).logits(ids).numpy()
    reference = numpy_reference.forward(tensors, config, ids)
    assert np.abs(ours - reference).max() < 1e-4


HF_CONFIGS = {
    "gqa": {},
    "mha-tied": dict(num_key_value_heads=6, tie_word_embeddings=True),
    "odd-9-heads-3-kv": dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3, intermediate_size=100),
    "head-dim-not-dim-over-heads": dict(head_dim=16, num_attention_heads=4, num_key_value_heads=1),
    "rope-linear": dict(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
    "rope-llama3": dict(
        rope_parameters={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16, "rope_theta": 500000.0,
        }
    ),
}


@pytest.mark.parametrize("name", HF_CONFIGS)
def test_matches_hugging_face_llama(name):
    hf_model = random_hf_model(seed=len(name), **HF_CONFIGS[name])
    ours = llama_from_hf(hf_model)
    ids = [(i * 37 + 11) % 258 for i in range(70)]  # long enough for rope scaling to matter
    difference = (ours.logits(ids) - hf_logits(hf_model, ids)).abs().max()
    assert difference <= 1e-4


def test_rope_scaling_changes_the_model():
    # Guard for the parity test above: the scaled configs really differ from unscaled.
    plain = llama_from_hf(random_hf_model(seed=1))
    scaled = llama_from_hf(random_hf_model(seed=1, **HF_CONFIGS["rope-linear"]))
    ids = list(range(30))
    assert (plain.logits(ids) - scaled.logits(ids)).abs().max() > 1e-2


def test_tied_output_head_shares_the_embedding():
    transformer = Llama.random(tiny_args(tie_embeddings=True)).transformer
    assert transformer.output.weight is transformer.tok_embeddings.weight


# --- rotary tables sized by the caches made ------------------------------------------------


def gemma_like_args(**overrides):
    """A long context, windowed layers with a rotation of their own: four rotary tables."""
    return tiny_args(max_seq_len=32768, sliding_window=8, windowed_layers=(True, False), local_rope_theta=10000.0,
                     rope_theta=1e6, **overrides)


def test_rotary_tables_hold_the_positions_of_the_caches_made_not_the_whole_context():
    model = Llama.random(gemma_like_args(), seed=0)
    tables = model.transformer.rotary_table_names
    assert len(tables) == 4 and {getattr(model.transformer, name).shape[0] for name in tables} == {0}
    model.new_cache(64)
    assert {getattr(model.transformer, name).shape[0] for name in tables} == {64}
    model.new_cache(16)  # a smaller cache later: the first may still be in use
    assert model.transformer.rope_cos.shape[0] == 64
    model.new_cache(100)
    assert {getattr(model.transformer, name).shape[0] for name in tables} == {100}


def test_grown_rotary_tables_turn_exactly_as_tables_of_the_whole_context():
    args = gemma_like_args()
    for whole, grown in zip(rope_tables(args, args.max_seq_len), rope_tables(args, 70)):
        assert torch.equal(whole[:70], grown)
    ids = [(29 * i) % 250 + 3 for i in range(60)]
    small, whole = Llama.random(args, seed=2), Llama.random(args, seed=2)
    whole.transformer.fit_rope(args.max_seq_len)
    results = []
    for model in (small, whole):
        cache = model.new_cache(60)
        with torch.inference_mode():
            prompt = model.transformer(torch.tensor([ids[:50]]), cache)
            steps = [model.transformer(torch.tensor([[token]]), cache) for token in ids[50:]]
        results.append(torch.cat([prompt, *steps], dim=1))
    assert small.transformer.rope_cos.shape[0] == 60
    assert torch.equal(results[0], results[1])
    # No cache: a sequence longer than the tables turns by tables of its own, as exactly.
    assert torch.equal(small.logits(ids), whole.logits(ids))


def test_a_cache_made_directly_grows_the_tables_when_the_model_is_called():
    model = Llama.random(gemma_like_args(), seed=1)
    cache = KVCache(model.args, 40)
    with torch.inference_mode():
        model.transformer(torch.tensor([[5, 6, 7]]), cache)
    assert model.transformer.rope_local_cos.shape[0] == 40


def test_a_position_past_the_rotary_tables_is_refused_in_one_line():
    model = Llama.random(gemma_like_args(), seed=1)
    model.new_cache(8)
    call = KVCache(model.args, 32).call(12)  # a call of a cache the tables were never grown for
    with pytest.raises(ValueError, match=r"^position 12 is past the rotary tables' 8 positions \(they grow"):
        model.transformer.forward_embeddings(torch.zeros(1, 12, model.args.dim), call)
