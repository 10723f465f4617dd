import json
from pathlib import Path

import pytest
import torch

from llama_chat.checkpoints.meta import load_meta_directory, meta_hidden_dim
from llama_chat.checkpoints.stored import HeadRows, TensorMatrix
from llama_chat.engine.config import ModelArgs, RopeScaling
from llama_chat.engine.rope import apply_rotary, head_feature_order, rope_inverse_frequencies, rope_tables
from llama_chat.errors import LlamaChatError
from llama_chat.text.sentencepiece_tokenizer import SentencePieceTokenizer
from llama_chat.text.tiktoken_tokenizer import TiktokenTokenizer

from .hf_reference import NotATensor, hf_logits, llama_from_checkpoint, random_hf_model
from .test_tokenizer_spm import CORPUS, train_tiny_spm
from .test_tokenizer_tiktoken import train_byte_bpe, write_tiktoken_file

IDS = [5, 99, 17, 250, 3, 64, 120, 7, 0, 199, 33, 42]
SPM_VOCAB = 420
TIKTOKEN_BASE = 300  # 256 bytes + 44 merges, then Llama 3's 256 special tokens


def interleave_rotary(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Hugging Face half-split q/k rows back to Meta's interleaved pairs (the inverse of the loader)."""
    rows, columns = weight.shape
    half = rows // n_heads // 2
    return weight.reshape(n_heads, 2, half, columns).transpose(1, 2).reshape(rows, columns)


def meta_state_dict(hf_state: dict, config) -> dict[str, torch.Tensor]:
    """An independent Meta writer: Meta's names, interleaved rotary rows, unfused projections."""
    state = {
        "tok_embeddings.weight": hf_state["model.embed_tokens.weight"],
        "norm.weight": hf_state["model.norm.weight"],
    }
    if not config.tie_word_embeddings:
        state["output.weight"] = hf_state["lm_head.weight"]
    names = {
        "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
        "feed_forward.w1": "mlp.gate_proj", "feed_forward.w2": "mlp.down_proj",
        "feed_forward.w3": "mlp.up_proj", "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
    for i in range(config.num_hidden_layers):
        hf = f"model.layers.{i}."
        for meta_name, hf_name in names.items():
            state[f"layers.{i}.{meta_name}.weight"] = hf_state[f"{hf}{hf_name}.weight"]
        q = hf_state[hf + "self_attn.q_proj.weight"]
        k = hf_state[hf + "self_attn.k_proj.weight"]
        state[f"layers.{i}.attention.wq.weight"] = interleave_rotary(q, config.num_attention_heads)
        state[f"layers.{i}.attention.wk.weight"] = interleave_rotary(k, config.num_key_value_heads)
    return state


def split_model_parallel(state: dict, n_shards: int, embedding_dim: int) -> list[dict]:
    """Meta's model-parallel slices: column-parallel layers by rows, row-parallel by columns."""
    shards = [{} for _ in range(n_shards)]
    for name, tensor in state.items():
        kind = name.split(".")[-2]
        if tensor.ndim == 1:
            pieces = [tensor] * n_shards  # norms are replicated
        elif kind in ("wo", "w2"):
            pieces = tensor.chunk(n_shards, dim=1)
        elif kind == "tok_embeddings":
            pieces = tensor.chunk(n_shards, dim=embedding_dim)
        else:
            pieces = tensor.chunk(n_shards, dim=0)
        for shard, piece in zip(shards, pieces):
            shard[name] = piece.clone()
    return shards


def write_meta_directory(directory: Path, model, params: dict, *, embedding_dim: int, n_shards: int = 2) -> Path:
    directory.mkdir(exist_ok=True)
    state = meta_state_dict(model.state_dict(), model.config)
    for index, shard in enumerate(split_model_parallel(state, n_shards, embedding_dim)):
        torch.save(shard, directory / f"consolidated.{index:02d}.pth")
    (directory / "params.json").write_text(json.dumps(params))
    return directory


def llama2_style(tmp_path: Path):
    """Multi-head attention, SentencePiece, vocab_size -1, embedding split by features."""
    model = random_hf_model(seed=1, vocab_size=SPM_VOCAB, hidden_size=48, intermediate_size=128,
                            num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-5)
    params = {"dim": 48, "n_layers": 2, "n_heads": 4, "multiple_of": 32, "norm_eps": 1e-5, "vocab_size": -1}
    directory = write_meta_directory(tmp_path / "llama-2", model, params, embedding_dim=1)
    train_tiny_spm(directory / "tokenizer.model", SPM_VOCAB)
    return model, directory


def llama3_style(tmp_path: Path, tied: bool):
    """Grouped-query attention, tiktoken, Llama 3.1 rope scaling, embedding split by vocabulary."""
    vocab = TIKTOKEN_BASE + 256
    rope_scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}
    model = random_hf_model(seed=2, vocab_size=vocab, hidden_size=64, intermediate_size=224,
                            num_attention_heads=8, num_key_value_heads=2, rope_theta=500000.0,
                            rope_scaling=rope_scaling, tie_word_embeddings=tied, max_position_embeddings=256)
    params = {"dim": 64, "n_layers": 2, "n_heads": 8, "n_kv_heads": 2, "vocab_size": vocab,
              "multiple_of": 32, "ffn_dim_multiplier": 1.3, "norm_eps": 1e-5, "rope_theta": 500000.0,
              "use_scaled_rope": True}
    directory = write_meta_directory(tmp_path / "llama-3", model, params, embedding_dim=0)
    write_tiktoken_file(directory / "tokenizer.model", train_byte_bpe(CORPUS, TIKTOKEN_BASE - 256))
    return model, directory


@pytest.mark.parametrize("rotary_dim", [8, 4])
def test_rotary_permutation_matches_meta_interleaved_rotation(rotary_dim):
    """Meta rotates (x0,x1),(x2,x3)... as complex numbers (over the first rotary_dim features
    of each head, the rest left alone); after the reordering, the half-split rotation must
    give the same values, in our order."""
    args = ModelArgs(dim=32, n_layers=1, n_heads=4, vocab_size=8, hidden_dim=8, max_seq_len=16,
                     rotary_dim=rotary_dim)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(10, args.dim, generator=generator)
    meta_weight = torch.randn(args.dim, args.dim, generator=generator)
    turning = rope_inverse_frequencies(args)[: rotary_dim // 2]
    angles = torch.outer(torch.arange(10, dtype=torch.float64), turning).float()
    heads = (x @ meta_weight.T).view(10, args.n_heads, -1)
    meta_q = torch.view_as_complex(heads[..., :rotary_dim].reshape(10, args.n_heads, -1, 2).contiguous())
    meta_rotated = torch.view_as_real(meta_q * torch.polar(torch.ones_like(angles), angles)[:, None, :])
    meta_heads = torch.cat([meta_rotated.flatten(-2), heads[..., rotary_dim:]], dim=-1)
    order = head_feature_order(args.head_dim, rotary_dim, interleaved=True)
    cos, sin = rope_tables(args, 10)
    weight = HeadRows(TensorMatrix.of(meta_weight), args.n_heads, order).dense()
    ours = apply_rotary((x @ weight.T).view(1, 10, args.n_heads, -1), cos, sin)
    torch.testing.assert_close(ours[0], meta_heads[..., order], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("dim", "multiple_of", "multiplier", "hidden"),
    [(4096, 256, None, 11008), (8192, 4096, 1.3, 28672), (4096, 1024, 1.3, 14336), (2048, 256, 1.5, 8192),
     (48, 32, None, 128), (64, 32, 1.3, 224)],
)
def test_hidden_dim_follows_meta_reference(dim, multiple_of, multiplier, hidden):
    assert meta_hidden_dim(dim, multiple_of, multiplier) == hidden


def test_llama2_style_checkpoint_matches_transformers(tmp_path):
    model, directory = llama2_style(tmp_path)
    checkpoint = load_meta_directory(directory)
    args = checkpoint.args
    assert (args.vocab_size, args.hidden_dim, args.n_kv_heads, args.rope_theta) == (SPM_VOCAB, 128, 4, 10000.0)
    assert args.rope_scaling == RopeScaling() and not args.tie_embeddings
    assert isinstance(checkpoint.tokenizer, SentencePieceTokenizer)
    assert checkpoint.chat_template is None
    assert (checkpoint.bos_token, checkpoint.eos_token, checkpoint.stop_ids) == ("<s>", "</s>", frozenset({2}))
    ours = llama_from_checkpoint(checkpoint).logits(IDS)
    torch.testing.assert_close(ours, hf_logits(model, IDS), atol=1e-4, rtol=0)


@pytest.mark.parametrize("tied", [False, True])
def test_llama3_style_checkpoint_matches_transformers(tmp_path, tied):
    model, directory = llama3_style(tmp_path, tied)
    checkpoint = load_meta_directory(directory)
    args = checkpoint.args
    assert (args.vocab_size, args.hidden_dim, args.n_kv_heads, args.max_seq_len) == (556, 224, 2, 131072)
    assert args.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    assert args.tie_embeddings is tied
    assert isinstance(checkpoint.tokenizer, TiktokenTokenizer)
    base = TIKTOKEN_BASE
    assert (checkpoint.bos_token, checkpoint.eos_token) == ("<|begin_of_text|>", "<|end_of_text|>")
    assert checkpoint.stop_ids == frozenset({base + 1, base + 8, base + 9})
    ids = [base, *IDS, base + 6, 200, base + 7]
    ours = llama_from_checkpoint(checkpoint).logits(ids)
    torch.testing.assert_close(ours, hf_logits(model, ids), atol=1e-4, rtol=0)


def test_single_shard_loads_too(tmp_path):
    model, directory = llama2_style(tmp_path)
    for path in directory.glob("consolidated.*.pth"):
        path.unlink()
    state = meta_state_dict(model.state_dict(), model.config)
    torch.save(state, directory / "consolidated.00.pth")
    ours = llama_from_checkpoint(load_meta_directory(directory)).logits(IDS)
    torch.testing.assert_close(ours, hf_logits(model, IDS), atol=1e-4, rtol=0)


def test_pickled_code_is_refused(tmp_path):
    _, directory = llama2_style(tmp_path)
    shard = torch.load(directory / "consolidated.01.pth", weights_only=True)
    shard["extra"] = NotATensor()
    torch.save(shard, directory / "consolidated.01.pth")
    with pytest.raises(LlamaChatError, match=r"consolidated\.01\.pth: refused: needs arbitrary code to load"):
        load_meta_directory(directory)


def test_shape_disagreeing_with_params_is_refused(tmp_path):
    _, directory = llama2_style(tmp_path)
    params = json.loads((directory / "params.json").read_text())
    params["multiple_of"] = 48  # hidden 128 -> 144
    (directory / "params.json").write_text(json.dumps(params))
    with pytest.raises(LlamaChatError, match=r"consolidated\.\*\.pth .*'layers\.0\.feed_forward\.w1\.weight' "
                                             r"has shape \(128, 48\) but params.json implies \(144, 48\)"):
        load_meta_directory(directory)


def test_missing_tensor_is_named(tmp_path):
    _, directory = llama2_style(tmp_path)
    shard = torch.load(directory / "consolidated.00.pth", weights_only=True)
    del shard["layers.1.attention.wk.weight"]
    torch.save(shard, directory / "consolidated.00.pth")
    with pytest.raises(LlamaChatError, match="shard 0 has no tensor 'layers.1.attention.wk.weight'"):
        load_meta_directory(directory)


def test_shards_that_do_not_fit_together_are_one_line(tmp_path):
    _, directory = llama2_style(tmp_path)
    shard = torch.load(directory / "consolidated.01.pth", weights_only=True)
    shard["layers.0.attention.wo.weight"] = shard["layers.0.attention.wo.weight"][:-1]  # a row short
    torch.save(shard, directory / "consolidated.01.pth")
    with pytest.raises(LlamaChatError, match="the shards of tensor 'layers.0.attention.wo.weight' do not fit"):
        load_meta_directory(directory)


@pytest.mark.parametrize(("missing", "message"), [
    ("params.json", "params.json: no such file"),
    ("tokenizer.model", "tokenizer.model: no such file"),
    ("consolidated.*.pth", r"no consolidated\.\*\.pth weight files"),
])
def test_missing_files_are_reported(tmp_path, missing, message):
    _, directory = llama2_style(tmp_path)
    for path in directory.glob(missing):
        path.unlink()
    with pytest.raises(LlamaChatError, match=message):
        load_meta_directory(directory)


def test_corrupt_shard_is_reported(tmp_path):
    _, directory = llama2_style(tmp_path)
    shard = directory / "consolidated.00.pth"
    shard.write_bytes(b"garbage")
    with pytest.raises(LlamaChatError, match="not a readable PyTorch weight file"):
        load_meta_directory(directory)
    shard.write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(LlamaChatError, match="not a readable PyTorch weight file"):
        load_meta_directory(directory)


@pytest.mark.parametrize("change, message", [
    ({"n_heads": "4"}, "n_heads is '4', where a positive whole number belongs"),
    ({"multiple_of": 0}, "multiple_of is 0, where a positive whole number belongs"),
    ({"ffn_dim_multiplier": 1e300}, "ffn_dim_multiplier is 1e+300, where a number near 1 belongs"),
    ({"norm_eps": None, "rope_theta": "wide"}, "rope_theta is 'wide', where a number belongs"),
    ({"vocab_size": 1.5}, "vocab_size is 1.5, where a positive whole number belongs"),
])
def test_params_of_the_wrong_types_are_one_line_naming_the_file(tmp_path, change, message):
    _, directory = llama2_style(tmp_path)
    params = json.loads((directory / "params.json").read_text())
    (directory / "params.json").write_text(json.dumps({**params, **change}))
    with pytest.raises(LlamaChatError) as refused:
        load_meta_directory(directory)
    assert str(refused.value) == f"{directory / 'params.json'}: {message}"
