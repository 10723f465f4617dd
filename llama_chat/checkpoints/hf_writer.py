"""Writing a checkpoint as a Hugging Face-style directory (what `llama-chat convert` and training save).

The directory holds config.json, model.safetensors (Hugging Face tensor names, so
transformers can read it too), the tokenizer, tokenizer_config.json with the chat
template, and generation_config.json with the end-of-turn ids: a folder that other
tools (transformers among them) read as well, in float32, bfloat16 or float16.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.hf import HF_NAMES
from llama_chat.directories import staged_directory
from llama_chat.engine.config import ModelArgs


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
    multipliers = {"embedding_multiplier": args.embedding_scale, "residual_multiplier": args.residual_scale,
                   "attention_multiplier": args.attention_scale or args.head_dim**-0.5,
                   "logits_scaling": args.logit_scale}
    granite = (args.embedding_scale, args.residual_scale, args.attention_scale, args.logit_scale) != (1, 1, None, 1)
    model_type = "qwen2" if args.qkv_bias else "qwen3" if args.qk_norm else "granite" if granite else "llama"
    classes = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "granite": "GraniteForCausalLM"}
    return {
        "architectures": [classes.get(model_type, "LlamaForCausalLM")],
        "model_type": model_type,
        **(multipliers if granite else {}),
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
        if args.qkv_bias:
            q_bias, k_bias, v_bias = tensors[ours + "attention.qkv_bias"].split([q_rows, kv_rows, kv_rows])
            layer.update({names.q_bias: q_bias, names.k_bias: k_bias, names.v_bias: v_bias})
        if args.qk_norm:
            layer.update({names.q_norm: tensors[ours + "attention.q_norm.weight"],
                          names.k_norm: tensors[ours + "attention.k_norm.weight"]})
        out.update({template.format(i=i): own(tensor) for template, tensor in layer.items()})
    return out


def write_hf_directory(checkpoint: Checkpoint, destination: Path, dtype: torch.dtype) -> None:
    """Write the directory beside its final place, then move it in: never half a checkpoint."""
    with staged_directory(destination) as staging:
        write_hf_files(checkpoint, staging, dtype)


def write_hf_files(checkpoint: Checkpoint, directory: Path, dtype: torch.dtype) -> None:
    """The checkpoint's files, written into an existing `directory`."""
    tokenizer_config = checkpoint.tokenizer.save(directory)
    tokenizer_config.update(bos_token=checkpoint.bos_token, eos_token=checkpoint.eos_token)
    if checkpoint.chat_template:
        tokenizer_config["chat_template"] = checkpoint.chat_template
    write_json(directory / "tokenizer_config.json", tokenizer_config)
    write_json(directory / "config.json", hf_config(checkpoint.args, checkpoint))
    write_json(directory / "generation_config.json", {
        "bos_token_id": checkpoint.tokenizer.bos_id,
        "eos_token_id": sorted(checkpoint.stop_ids),
    })
    save_file(to_hf_tensors(checkpoint.state_dict(dtype), checkpoint.args, dtype), directory / "model.safetensors",
              metadata={"format": "pt"})


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
