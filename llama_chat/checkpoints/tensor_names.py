"""A checkpoint format's tensor names and layouts, mapped onto this project's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llama_chat.checkpoints.contents import Weight
from llama_chat.checkpoints.stored import RotaryRows, StackedRows, StoredMatrix
from llama_chat.engine.config import ModelArgs
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
        names.q: (q_rows, args.dim), names.k: (kv_rows, args.dim), names.v: (kv_rows, args.dim),
        names.o: (args.dim, q_rows),
        names.gate: (args.hidden_dim, args.dim), names.up: (args.hidden_dim, args.dim),
        names.down: (args.dim, args.hidden_dim),
        names.attention_norm: (args.dim,), names.ffn_norm: (args.dim,),
    }
    if args.qkv_bias:
        per_layer.update({names.q_bias: (q_rows,), names.k_bias: (kv_rows,), names.v_bias: (kv_rows,)})
    if args.qk_norm:
        per_layer.update({names.q_norm: (args.head_dim,), names.k_norm: (args.head_dim,)})
    for i in range(args.n_layers):
        shapes.update({name.format(i=i): shape for name, shape in per_layer.items()})
    return shapes


def assemble_state_dict(args: ModelArgs, names: TensorNames, take, *, interleaved_rotary: bool) -> dict[str, Weight]:
    """Our weights from a format's: `take(name)` returns one checked tensor or StoredMatrix.

    Fuses q/k/v and gate/up into one matrix each, and brings q/k rows stored in the
    interleaved rotary layout into the half-split one the model uses; nothing is read yet.
    """

    def rotary(weight: StoredMatrix, n_heads: int) -> StoredMatrix:
        return RotaryRows(weight, n_heads) if interleaved_rotary else weight

    state = {"tok_embeddings.weight": take(names.embeddings), "norm.weight": take(names.norm)}
    state["output.weight"] = state["tok_embeddings.weight"] if args.tie_embeddings else take(names.output)
    for i in range(args.n_layers):
        def layer(template: str) -> Weight:
            return take(template.format(i=i))

        ours = f"layers.{i}."
        state[ours + "attention.wqkv.weight"] = StackedRows([
            rotary(layer(names.q), args.n_heads), rotary(layer(names.k), args.n_kv_heads), layer(names.v)
        ])
        state[ours + "attention.wo.weight"] = layer(names.o)
        state[ours + "feed_forward.w13.weight"] = StackedRows([layer(names.gate), layer(names.up)])
        state[ours + "feed_forward.w2.weight"] = layer(names.down)
        state[ours + "attention_norm.weight"] = layer(names.attention_norm)
        state[ours + "ffn_norm.weight"] = layer(names.ffn_norm)
        if args.qkv_bias:
            if interleaved_rotary:  # no format with this layout has biases yet: refused, not guessed
                raise LlamaChatError("q, k and v biases in the interleaved rotary layout are not supported")
            state[ours + "attention.qkv_bias"] = torch.cat([layer(names.q_bias), layer(names.k_bias),
                                                            layer(names.v_bias)])
        if args.qk_norm:
            state[ours + "attention.q_norm.weight"] = layer(names.q_norm)
            state[ours + "attention.k_norm.weight"] = layer(names.k_norm)
    return state
