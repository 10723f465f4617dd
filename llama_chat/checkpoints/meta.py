"""Meta's original Llama checkpoints: params.json, consolidated.NN.pth shards, tokenizer.model.

Meta stores each model-parallel rank's slice of the weights in its own shard and
rotates interleaved feature pairs; loading merges the slices (as stored matrices read
shard by shard, without a merged copy) and permutes q/k rows into the half-split
rotary layout the model uses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from llama_chat.checkpoints.contents import Checkpoint, Weight
from llama_chat.untrusted_files import read_json_object
from llama_chat.checkpoints.stored import ColumnStacked, StackedRows, TensorMatrix
from llama_chat.checkpoints.tensor_names import TensorNames, assemble_state_dict, checked_float, expected_shapes
from llama_chat.checkpoints.tokenizer_files import load_tokenizer_model
from llama_chat.checkpoints.torch_file import load_torch_file
from llama_chat.checkpoints.values import context_length, layer_count, real_number, whole_number
from llama_chat.engine.config import ModelArgs, RopeScaling
from llama_chat.errors import LlamaChatError
from llama_chat.text.tiktoken_tokenizer import TiktokenTokenizer

_SPLIT_DIM = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "output": 0, "wo": 1, "w2": 1}


def load_meta_directory(path: str | Path) -> Checkpoint:
    """Load a directory of Meta's format: params.json, consolidated.*.pth, tokenizer.model."""
    directory = Path(path)
    params = _read_params(directory / "params.json")
    tokenizer = load_tokenizer_model(directory / "tokenizer.model")
    shard_paths = sorted(directory.glob("consolidated.*.pth"))
    if not shard_paths:
        raise LlamaChatError(f"{directory}: no consolidated.*.pth weight files")
    shards = [load_torch_file(shard) for shard in shard_paths]
    args = args_from_meta_params(
        params,
        tokenizer_vocab_size=tokenizer.vocab_size,
        tie_embeddings="output.weight" not in shards[0],
        llama3=isinstance(tokenizer, TiktokenTokenizer),
        source=directory / "params.json",
    )
    tensors = convert_meta_shards(shards, args, source=_describe(shard_paths))
    return Checkpoint(
        args=args,
        tensors=tensors,
        tokenizer=tokenizer,
        chat_template=None,  # Meta ships no template: a built-in chat format is used
        bos_token=tokenizer.token_name(tokenizer.bos_id),
        eos_token=tokenizer.token_name(tokenizer.eos_id),
    )


def meta_hidden_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """The SwiGLU width Meta's reference derives from dim (2/3 of 4*dim, scaled, rounded up)."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * math.ceil(hidden / multiple_of)


def args_from_meta_params(
    params: Mapping,
    *,
    tokenizer_vocab_size: int,
    tie_embeddings: bool = False,
    llama3: bool = False,
    source: object = "params.json",
) -> ModelArgs:
    """ModelArgs from a params.json (`source` names it in errors), every value's type
    checked before use; vocab_size -1 (or 0) means "as many as the tokenizer has"."""

    def whole(key: str, value: object) -> int:
        if value is None:
            raise LlamaChatError(f"{source} has no {key!r}: is this a Meta Llama checkpoint?")
        return whole_number(value, key, source)

    def real(key: str, default: float) -> float:
        value = params.get(key)
        return real_number(default if value is None else value, key, source)

    dim, n_heads = whole("dim", params.get("dim")), whole("n_heads", params.get("n_heads"))
    vocab_size = params.get("vocab_size", -1)
    multiplier = params.get("ffn_dim_multiplier")
    if multiplier is not None and not 0 < real_number(multiplier, "ffn_dim_multiplier", source) <= 64:
        raise LlamaChatError(f"{source}: ffn_dim_multiplier is {multiplier}, where a number near 1 belongs")
    return ModelArgs(
        dim=dim,
        n_layers=layer_count(whole("n_layers", params.get("n_layers")), "n_layers", source),
        n_heads=n_heads,
        n_kv_heads=whole("n_kv_heads", params.get("n_kv_heads") or n_heads),
        vocab_size=(
            tokenizer_vocab_size if type(vocab_size) is int and vocab_size <= 0 else whole("vocab_size", vocab_size)
        ),
        hidden_dim=meta_hidden_dim(dim, whole("multiple_of", params.get("multiple_of", 256)), multiplier),
        norm_eps=real("norm_eps", 1e-5),
        rope_theta=real("rope_theta", 10000.0),
        rope_scaling=_meta_rope_scaling(params, dim, source),
        max_seq_len=context_length(whole("max_seq_len", params.get("max_seq_len") or _default_context(params, llama3)),
                                   "max_seq_len", source),
        tie_embeddings=tie_embeddings,
    )


def _meta_rope_scaling(params: Mapping, dim: int, source: object) -> RopeScaling:
    if not params.get("use_scaled_rope"):
        return RopeScaling()
    # params.json does not record the factor: 8 for Llama 3.1 and later large models,
    # 32 for Llama 3.2 1B and 3B (dim 2048 and 3072), as Hugging Face's converter assumes.
    factor = params.get("rope_scaling_factor") or (32.0 if dim < 4096 else 8.0)
    return RopeScaling(
        kind="llama3",
        factor=real_number(factor, "rope_scaling_factor", source),
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )


def _default_context(params: Mapping, llama3: bool) -> int:
    if params.get("use_scaled_rope"):
        return 131072
    return 8192 if llama3 else 4096


META_NAMES = TensorNames(
    embeddings="tok_embeddings.weight",
    norm="norm.weight",
    output="output.weight",
    q="layers.{i}.attention.wq.weight",
    k="layers.{i}.attention.wk.weight",
    v="layers.{i}.attention.wv.weight",
    o="layers.{i}.attention.wo.weight",
    gate="layers.{i}.feed_forward.w1.weight",
    up="layers.{i}.feed_forward.w3.weight",
    down="layers.{i}.feed_forward.w2.weight",
    attention_norm="layers.{i}.attention_norm.weight",
    ffn_norm="layers.{i}.ffn_norm.weight",
)


def convert_meta_shards(
    shards: Sequence[Mapping[str, torch.Tensor]], args: ModelArgs, *, source: str = "checkpoint"
) -> dict[str, Weight]:
    """Merge Meta model-parallel shards into one state dict in this project's names and layout."""

    shapes = expected_shapes(args, META_NAMES)

    def take(name: str) -> Weight:
        return _merged(shards, name, shapes[name], args.dim, source)

    return assemble_state_dict(args, META_NAMES, take, interleaved_rotary=True)


def _merged(
    shards: Sequence[Mapping[str, torch.Tensor]], name: str, expected: tuple[int, ...], dim: int, source: str
) -> Weight:
    pieces = []
    for index, shard in enumerate(shards):
        if name not in shard:
            raise LlamaChatError(f"{source}: shard {index} has no tensor {name!r}")
        pieces.append(checked_float(shard[name], name, source))
    kind = name.split(".")[-2]
    if pieces[0].ndim == 1:
        merged = pieces[0]  # a norm, replicated on every rank
    elif len(pieces) == 1:
        merged = TensorMatrix.of(pieces[0])
    else:
        # Llama 1/2 split the embedding's features; Llama 3 splits its vocabulary.
        split = (0 if pieces[0].shape[1] == dim else 1) if kind == "tok_embeddings" else _SPLIT_DIM[kind]
        kept = 1 - split  # the dimension every shard has whole
        if any(piece.shape[kept] != pieces[0].shape[kept] for piece in pieces):
            shapes = ", ".join(str(tuple(piece.shape)) for piece in pieces)
            raise LlamaChatError(f"{source}: the shards of tensor {name!r} do not fit together ({shapes})")
        parts = [TensorMatrix.of(piece) for piece in pieces]
        merged = StackedRows(parts) if split == 0 else ColumnStacked(parts)
    if tuple(merged.shape) != expected:
        raise LlamaChatError(
            f"{source}: tensor {name!r} has shape {tuple(merged.shape)} but params.json implies {expected}"
        )
    return merged


def _read_params(path: Path) -> dict:
    params = read_json_object(path)
    if params is None:
        raise LlamaChatError(f"{path}: no such file (a Meta checkpoint directory has params.json)")
    return params


def _describe(shard_paths: Sequence[Path]) -> str:
    if len(shard_paths) == 1:
        return str(shard_paths[0])
    return f"{shard_paths[0].parent / 'consolidated.*.pth'} ({len(shard_paths)} shards)"
