"""`llama-chat convert SRC DST`: any supported checkpoint to a Hugging Face-style directory.

The directory holds config.json, model.safetensors (Hugging Face tensor names, so
transformers can read it too), the tokenizer, tokenizer_config.json with the chat
template, and generation_config.json with the end-of-turn ids: a folder that other
tools (transformers among them) read as well, in float32, bfloat16 or float16.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from llama_chat.checkpoints.checkpoint import Checkpoint
from llama_chat.checkpoints.hf import HF_NAMES
from llama_chat.engine.config import ModelArgs
from llama_chat.engine.device import resolve_dtype
from llama_chat.errors import LlamaChatError
from llama_chat.loading import read_checkpoint


def hf_config(args: ModelArgs, checkpoint: Checkpoint) -> dict:
    """config.json for a LlamaConfig with these hyper-parameters."""
    scaling = args.rope_scaling
    rope_scaling = None
    if scaling.kind == "linear":
        rope_scaling = {"rope_type": "linear", "factor": scaling.factor}
    elif scaling.kind == "llama3":
        rope_scaling = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "intermediate_size": args.hidden_dim,
        "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": args.max_seq_len,
        "tie_word_embeddings": args.tie_embeddings,
        "hidden_act": "silu",
        "bos_token_id": checkpoint.tokenizer.bos_id,
        "eos_token_id": checkpoint.tokenizer.eos_id,
        # Ignored by other readers; lets llama-chat pack the weights as tightly as the source.
        "llama_chat": {"source_quantization": checkpoint.source_quantization},
    }


def to_hf_tensors(tensors: dict[str, torch.Tensor], args: ModelArgs, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Our (dense) tensor names to Hugging Face's, splitting the fused projections again."""
    q_rows, kv_rows = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim

    def own(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype).contiguous().clone()  # safetensors wants unshared, contiguous storage

    names = HF_NAMES
    out = {names.embeddings: own(tensors["tok_embeddings.weight"]), names.norm: own(tensors["norm.weight"])}
    if not args.tie_embeddings:
        out[names.output] = own(tensors["output.weight"])
    for i in range(args.n_layers):
        ours = f"layers.{i}."
        q, k, v = tensors[ours + "attention.wqkv.weight"].split([q_rows, kv_rows, kv_rows])
        gate, up = tensors[ours + "feed_forward.w13.weight"].split(args.hidden_dim)
        layer = {
            names.q: q, names.k: k, names.v: v, names.o: tensors[ours + "attention.wo.weight"],
            names.gate: gate, names.up: up, names.down: tensors[ours + "feed_forward.w2.weight"],
            names.attention_norm: tensors[ours + "attention_norm.weight"],
            names.ffn_norm: tensors[ours + "ffn_norm.weight"],
        }
        out.update({template.format(i=i): own(tensor) for template, tensor in layer.items()})
    return out


def write_hf_directory(checkpoint: Checkpoint, destination: Path, dtype: torch.dtype) -> None:
    """Write the directory next to its final place, then move it in: never half a checkpoint."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=destination.parent))
    try:
        tokenizer_config = checkpoint.tokenizer.save(staging)
        tokenizer_config.update(bos_token=checkpoint.bos_token, eos_token=checkpoint.eos_token)
        if checkpoint.chat_template:
            tokenizer_config["chat_template"] = checkpoint.chat_template
        write_json(staging / "tokenizer_config.json", tokenizer_config)
        write_json(staging / "config.json", hf_config(checkpoint.args, checkpoint))
        write_json(staging / "generation_config.json", {
            "bos_token_id": checkpoint.tokenizer.bos_id,
            "eos_token_id": sorted(checkpoint.stop_ids),
        })
        save_file(to_hf_tensors(checkpoint.state_dict(dtype), checkpoint.args, dtype), staging / "model.safetensors",
                  metadata={"format": "pt"})
        give_usual_permissions(staging)
        staging.rename(destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def give_usual_permissions(directory: Path) -> None:
    """mkdtemp makes a private folder: open it up as far as the umask allows a new one."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llama-chat convert", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a .gguf file, or a Meta or Hugging Face checkpoint directory")
    parser.add_argument("destination", help="the directory to create (must not exist yet)")
    parser.add_argument("--dtype", default="float32", help="float32 (default, exact), bfloat16 or float16")
    options = parser.parse_args(argv)
    destination = Path(options.destination).expanduser()
    if destination.exists():
        raise LlamaChatError(f"{destination} already exists; give a new directory to convert into")
    dtype = resolve_dtype(options.dtype, torch.device("cpu"))
    checkpoint = read_checkpoint(options.source)
    try:
        write_hf_directory(checkpoint, destination, dtype)
    except SafetensorError as error:  # its own I/O errors, a full disk among them
        raise LlamaChatError(f"{destination}: cannot write the weights ({error})") from None
    print(destination)
    return 0
