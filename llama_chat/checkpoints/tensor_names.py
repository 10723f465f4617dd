"""A checkpoint format's tensor names and layouts, mapped onto this project's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llama_chat.checkpoints.contents import Weight
from llama_chat.checkpoints.stored import HeadRows, RowRange, StackedRows
from llama_chat.engine.config import ModelArgs
from llama_chat.engine.rope import head_feature_order
from llama_chat.errors import LlamaChatError


@dataclass(frozen=True)
class TensorNames:
    """Where a checkpoint format keeps each weight; per-layer names contain "{i}"."""

    embeddings: str
    norm: str
    output: str
    q: str
    k: str
    v: str
    o: str
    gate: str
    up: str
    down: str
    attention_norm: str
    ffn_norm: str
    # Only where ModelArgs switches them on (qkv_bias, qk_norm); None where a format has no name.
    q_bias: str | None = None
    k_bias: str | None = None
    v_bias: str | None = None
    q_norm: str | None = None
    k_norm: str | None = None
    # Only with ModelArgs.sandwich_norms (Gemma): the norms after attention and after the feed-forward.
    post_attention_norm: str | None = None
    post_ffn_norm: str | None = None
    # Where a format keeps q, k and v as one tensor (rows q|k|v), and gate and up as one
    # (rows gate|up): Phi-3's; q, k, v, gate and up are then not looked for.
    qkv: str | None = None
    gate_up: str | None = None


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def checked_float(tensor: object, name: str, source: object) -> torch.Tensor:
    """The stored value if it is a float tensor; else one clear error naming file and tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise LlamaChatError(f"{source}: {name!r} is a {type(tensor).__name__}, not a tensor")
    if tensor.dtype not in FLOAT_DTYPES:
        raise LlamaChatError(
            f"{source}: tensor {name!r} is {tensor.dtype}; llama-chat loads float32, float16 or bfloat16 weights"
        )
    return tensor


def expected_shapes(args: ModelArgs, names: TensorNames) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor a Llama of these dimensions has, under a format's names
    (the output head only when it is not the embedding table)."""
    q_rows, kv_rows = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    shapes = {names.embeddings: (args.vocab_size, args.dim), names.norm: (args.dim,)}
    if not args.tie_embeddings:
        shapes[names.output] = (args.vocab_size, args.dim)
    per_layer = {
        names.o: (args.dim, q_rows), names.down: (args.dim, args.hidden_dim),
        names.attention_norm: (args.dim,), names.ffn_norm: (args.dim,),
    }
    if names.qkv:
        per_layer[names.qkv] = (q_rows + 2 * kv_rows, args.dim)
    else:
        per_layer.update({names.q: (q_rows, args.dim), names.k: (kv_rows, args.dim), names.v: (kv_rows, args.dim)})
    if names.gate_up:
        per_layer[names.gate_up] = (2 * args.hidden_dim, args.dim)
    else:
        per_layer.update({names.gate: (args.hidden_dim, args.dim), names.up: (args.hidden_dim, args.dim)})
    if args.qkv_bias:
        per_layer.update({names.q_bias: (q_rows,), names.k_bias: (kv_rows,), names.v_bias: (kv_rows,)})
    if args.qk_norm:
        per_layer.update({names.q_norm: (args.head_dim,), names.k_norm: (args.head_dim,)})
    if args.sandwich_norms:
        per_layer.update({names.post_attention_norm: (args.dim,), names.post_ffn_norm: (args.dim,)})
    for i in range(args.n_layers):
        shapes.update({name.format(i=i): shape for name, shape in per_layer.items()})
    return shapes


def assemble_state_dict(args: ModelArgs, names: TensorNames, take, *, interleaved_rotary: bool) -> dict[str, Weight]:
    """Our weights from a format's: `take(name)` returns one checked tensor or StoredMatrix.

    Fuses q/k/v and gate/up into one matrix each (or takes a format's fused ones), and
    brings each q and k head's features into our rotary layout (engine/rope's
    head_feature_order) from the interleaved one or from a partial rotation; nothing is read yet.
    """
    rotary = _rotary_reorder(args, interleaved_rotary)
    state = {"tok_embeddings.weight": take(names.embeddings), "norm.weight": take(names.norm)}
    state["output.weight"] = state["tok_embeddings.weight"] if args.tie_embeddings else take(names.output)
    for i in range(args.n_layers):
        layer = _layer_weights(args, names, lambda template, i=i: take(template.format(i=i)), rotary)
        state.update({f"layers.{i}.{name}": weight for name, weight in layer.items()})
    return state


def _rotary_reorder(args: ModelArgs, interleaved_rotary: bool) -> Callable[[Weight, int], Weight]:
    """What brings a q or k weight of so many heads into our rotary layout (nothing, where it is in it)."""
    order = head_feature_order(args.head_dim, args.rotary_dim, interleaved=interleaved_rotary)
    reordered = order != list(range(args.head_dim))

    def rotary(weight: Weight, n_heads: int) -> Weight:
        if not reordered:
            return weight
        if isinstance(weight, torch.Tensor):  # a bias or a per-head norm
            return weight.view(-1, args.head_dim)[:, order].reshape(weight.shape)
        return HeadRows(weight, n_heads, order)

    return rotary


def _layer_weights(
    args: ModelArgs, names: TensorNames, layer: Callable[[str], Weight], rotary: Callable[[Weight, int], Weight]
) -> dict[str, Weight]:
    """One layer's weights under our names (less the layers.{i}. prefix); `layer(template)`
    takes the format's tensor of this layer."""
    q_rows, kv_rows = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    if names.qkv:
        fused = layer(names.qkv)
        q, k, v = (RowRange(fused, first, count) for first, count in
                   ((0, q_rows), (q_rows, kv_rows), (q_rows + kv_rows, kv_rows)))
    else:
        q, k, v = layer(names.q), layer(names.k), layer(names.v)
    # Stacked parts even where the file fuses them: tensor parallelism splits each part.
    weights = {"attention.wqkv.weight": StackedRows([rotary(q, args.n_heads), rotary(k, args.n_kv_heads), v]),
               "attention.wo.weight": layer(names.o)}
    if names.gate_up:
        gate_up = layer(names.gate_up)
        gate, up = RowRange(gate_up, 0, args.hidden_dim), RowRange(gate_up, args.hidden_dim, args.hidden_dim)
    else:
        gate, up = layer(names.gate), layer(names.up)
    weights["feed_forward.w13.weight"] = StackedRows([gate, up])
    weights["feed_forward.w2.weight"] = layer(names.down)
    weights["attention_norm.weight"] = layer(names.attention_norm)
    weights["ffn_norm.weight"] = layer(names.ffn_norm)
    if args.qkv_bias:
        weights["attention.qkv_bias"] = torch.cat([
            rotary(layer(names.q_bias), args.n_heads), rotary(layer(names.k_bias), args.n_kv_heads),
            layer(names.v_bias),
        ])
    if args.qk_norm:
        weights["attention.q_norm.weight"] = rotary(layer(names.q_norm), 1)
        weights["attention.k_norm.weight"] = rotary(layer(names.k_norm), 1)
    if args.sandwich_norms:
        weights["post_attention_norm.weight"] = layer(names.post_attention_norm)
        weights["post_ffn_norm.weight"] = layer(names.post_ffn_norm)
    return weights
