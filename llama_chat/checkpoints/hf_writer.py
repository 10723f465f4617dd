"""Writing a checkpoint as a Hugging Face-style directory (what `llama-chat convert` and training save).

The directory holds config.json, model.safetensors (Hugging Face tensor names, so
transformers can read it too), the tokenizer, tokenizer_config.json with the chat
template, and generation_config.json with the end-of-turn ids: a folder that other
tools (transformers among them) read as well, in float32, bfloat16 or float16.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.hf import hf_names
from llama_chat.directories import staged_directory
from llama_chat.engine.config import ModelArgs, RopeScaling
from llama_chat.engine.rope import head_feature_order

# The Hugging Face classes of the architectures whose config.json differs from Llama's.
CLASSES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "granite": "GraniteForCausalLM",
           "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
MODEL_TYPES = {"gemma3": "gemma3_text"}  # Hugging Face's model_type where it is not the architecture's name


def gemma_config(args: ModelArgs) -> dict:
    """Gemma's own config.json entries (its norms are written as Hugging Face keeps them: w, not 1 + w)."""
    windowed = args.windowed_layers or (False,) * args.n_layers
    scalar = (args.attention_scale or args.head_dim**-0.5) ** -2
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": round(scalar) if math.isclose(scalar, round(scalar)) else scalar,  # a whole number
        "sliding_window": args.sliding_window or args.max_seq_len,
        "layer_types": ["sliding_attention" if kind else "full_attention" for kind in windowed],
        "rope_local_base_freq": args.local_rope_theta or args.rope_theta,
        "attn_logit_softcapping": args.attention_softcap,
        "final_logit_softcapping": args.logit_softcap,
    }


def rope_scaling_config(scaling: RopeScaling) -> dict | None:
    """config.json's rope_scaling entry for our rope scaling (None where there is none)."""
    if scaling.kind == "linear":
        return {"rope_type": "linear", "factor": scaling.factor}
    if scaling.kind == "llama3":
        return {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    if scaling.kind == "longrope":
        return {
            "rope_type": "longrope", "short_factor": list(scaling.short_factors),
            "long_factor": list(scaling.long_factors), "attention_factor": scaling.attention_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    return None


def hf_config(args: ModelArgs, checkpoint: Checkpoint) -> dict:
    """config.json for these hyper-parameters (a LlamaConfig, or the architecture's own)."""
    scaling = args.rope_scaling
    multipliers = {"embedding_multiplier": args.embedding_scale, "residual_multiplier": args.residual_scale,
                   "attention_multiplier": args.attention_scale or args.head_dim**-0.5,
                   "logits_scaling": args.logit_scale}
    architecture = args.architecture if args.architecture in CLASSES else "llama"
    return {
        "architectures": [CLASSES.get(architecture, "LlamaForCausalLM")],
        "model_type": MODEL_TYPES.get(architecture, architecture),
        **(multipliers if architecture == "granite" else {}),
        **(gemma_config(args) if args.sandwich_norms else {}),
        **({"partial_rotary_factor": args.rotary_dim / args.head_dim} if args.rotary_dim != args.head_dim else {}),
        # Phi-3's config reads its original context here, not from rope_scaling.
        **({"original_max_position_embeddings": scaling.original_max_position_embeddings}
           if scaling.kind == "longrope" else {}),
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "intermediate_size": args.hidden_dim,
        "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": rope_scaling_config(scaling),
        "max_position_embeddings": args.max_seq_len,
        "tie_word_embeddings": args.tie_embeddings,
        "hidden_act": "gelu_pytorch_tanh" if args.gelu_feed_forward else "silu",
        "bos_token_id": checkpoint.tokenizer.bos_id,
        "eos_token_id": checkpoint.tokenizer.eos_id,
        "pad_token_id": None,  # said: some classes' defaults (Phi-3's 32000) lie outside a small vocabulary
        # Ignored by other readers; lets llama-chat pack the weights as tightly as the source.
        "llama_chat": {"source_quantization": checkpoint.source_quantization},
    }


def to_hf_tensors(tensors: dict[str, torch.Tensor], args: ModelArgs, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Our (dense) tensor names to Hugging Face's, splitting the fused projections again."""
    q_rows, kv_rows = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim

    def own(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype).contiguous().clone()  # safetensors wants unshared, contiguous storage

    names = hf_names(args)
    if args.sandwich_norms:  # Gemma's norms as Hugging Face keeps them: w, applied as 1 + w
        tensors = {name: tensor - 1 if name.endswith("norm.weight") else tensor for name, tensor in tensors.items()}
    # Each q and k head's features back in the order Hugging Face's rotation reads them.
    order = torch.tensor(head_feature_order(args.head_dim, args.rotary_dim, interleaved=False)).argsort()

    def stored(rows: torch.Tensor) -> torch.Tensor:
        return rows.unflatten(0, (-1, args.head_dim))[:, order].flatten(0, 1)

    out = {names.embeddings: own(tensors["tok_embeddings.weight"]), names.norm: own(tensors["norm.weight"])}
    if not args.tie_embeddings:
        out[names.output] = own(tensors["output.weight"])
    for i in range(args.n_layers):
        ours = f"layers.{i}."
        q, k, v = tensors[ours + "attention.wqkv.weight"].split([q_rows, kv_rows, kv_rows])
        q, k = stored(q), stored(k)
        gate_up = tensors[ours + "feed_forward.w13.weight"]
        layer = {
            names.o: tensors[ours + "attention.wo.weight"], names.down: tensors[ours + "feed_forward.w2.weight"],
            names.attention_norm: tensors[ours + "attention_norm.weight"],
            names.ffn_norm: tensors[ours + "ffn_norm.weight"],
        }
        if names.qkv:
            layer[names.qkv] = torch.cat([q, k, v])
        else:
            layer.update({names.q: q, names.k: k, names.v: v})
        if names.gate_up:
            layer[names.gate_up] = gate_up
        else:
            layer.update(zip((names.gate, names.up), gate_up.split(args.hidden_dim)))
        if args.qkv_bias:
            q_bias, k_bias, v_bias = tensors[ours + "attention.qkv_bias"].split([q_rows, kv_rows, kv_rows])
            layer.update({names.q_bias: stored(q_bias), names.k_bias: stored(k_bias), names.v_bias: v_bias})
        if args.qk_norm:
            layer.update({names.q_norm: stored(tensors[ours + "attention.q_norm.weight"]),
                          names.k_norm: stored(tensors[ours + "attention.k_norm.weight"])})
        if args.sandwich_norms:
            layer.update({names.post_attention_norm: tensors[ours + "post_attention_norm.weight"],
                          names.post_ffn_norm: tensors[ours + "post_ffn_norm.weight"]})
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
