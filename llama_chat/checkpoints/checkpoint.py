"""What every checkpoint reader returns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from llama_chat.checkpoints.stored import RotaryRows, StackedRows, StoredMatrix
from llama_chat.engine.config import ModelArgs
from llama_chat.errors import LlamaChatError
from llama_chat.text.tokenizer import Tokenizer

Weight = torch.Tensor | StoredMatrix  # vectors as tensors, matrices read a block of rows at a time


@dataclass
class Checkpoint:
    """A model as read from disk, in this project's tensor names and rotary layout."""

    args: ModelArgs
    # Our names: norms as tensors on the CPU (any float dtype), matrices as StoredMatrix,
    # read only when the loader packs or converts them.
    tensors: dict[str, Weight]
    tokenizer: Tokenizer
    chat_template: str | None  # Jinja source shipped with the model, if any
    bos_token: str | None = None  # token names, for templates
    eos_token: str | None = None
    # The GGUF type the layers' weights were stored as (e.g. "Q4_1"), whatever form they
    # reached us in: it tells how far they can be packed again without losing anything.
    source_quantization: str | None = None

    @property
    def stop_ids(self) -> frozenset[int]:
        """Every end-of-turn and end-of-sequence id: the tokenizer's, which the reader set up."""
        return self.tokenizer.stop_ids

    def state_dict(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Every tensor read and converted to `dtype` (a tied head is the embedding itself)."""
        return dense_state_dict(self.tensors, dtype)


def dense_state_dict(weights: dict[str, Weight], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Weights read into tensors of `dtype`; one weight under two names stays one tensor."""
    dense: dict[int, torch.Tensor] = {}
    state = {}
    for name, weight in weights.items():
        if id(weight) not in dense:
            value = weight.dense() if isinstance(weight, StoredMatrix) else weight
            dense[id(weight)] = value.to(dtype)
        state[name] = dense[id(weight)]
    return state


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


def read_json_object(path: Path) -> dict | None:
    """A JSON object file's contents, or None when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as file:
            contents = json.load(file)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LlamaChatError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(contents, dict):
        raise LlamaChatError(f"{path}: expected a JSON object")
    return contents


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
    return state
