"""Hugging Face Llama checkpoints: config.json hyper-parameters and tensor names."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..config import ModelArgs, RopeScaling
from ..errors import LlamaChatError


def args_from_hf_config(config: Mapping) -> ModelArgs:
    """ModelArgs from the contents of a Hugging Face LlamaConfig (config.json)."""
    try:
        n_heads = config["num_attention_heads"]
        dim = config["hidden_size"]
        return ModelArgs(
            dim=dim,
            n_layers=config["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=config.get("num_key_value_heads") or n_heads,
            head_dim=config.get("head_dim") or dim // n_heads,
            vocab_size=config["vocab_size"],
            hidden_dim=config["intermediate_size"],
            norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(config),
            rope_scaling=_rope_scaling(config.get("rope_scaling") or config.get("rope_parameters")),
            max_seq_len=config.get("max_position_embeddings", 2048),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    except KeyError as missing:
        raise LlamaChatError(f"config.json has no {missing.args[0]!r}: is this a Llama model?") from None


def _rope_theta(config: Mapping) -> float:
    parameters = config.get("rope_parameters") or {}
    return float(config.get("rope_theta") or parameters.get("rope_theta") or 10000.0)


def _rope_scaling(scaling: Mapping | None) -> RopeScaling:
    if not scaling:
        return RopeScaling()
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling(kind="linear", factor=float(scaling["factor"]))
    if kind == "llama3":
        return RopeScaling(
            kind="llama3",
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    raise LlamaChatError(f"unsupported rope scaling type {kind!r}: llama-chat supports linear and llama3")


def convert_hf_state_dict(tensors: Mapping[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Hugging Face tensor names to this project's, fusing q/k/v and gate/up.

    Hugging Face already stores q and k rows in the half-split rotary layout we use.
    """
    def take(name: str) -> torch.Tensor:
        try:
            return tensors[name]
        except KeyError:
            raise LlamaChatError(f"checkpoint is missing tensor {name!r}") from None

    state = {
        "tok_embeddings.weight": take("model.embed_tokens.weight"),
        "norm.weight": take("model.norm.weight"),
    }
    if args.tie_embeddings:
        state["output.weight"] = state["tok_embeddings.weight"]
    else:
        state["output.weight"] = take("lm_head.weight")
    for i in range(args.n_layers):
        hf = f"model.layers.{i}."
        ours = f"layers.{i}."
        state[ours + "attention.wqkv.weight"] = torch.cat(
            [take(hf + f"self_attn.{p}_proj.weight") for p in ("q", "k", "v")]
        )
        state[ours + "attention.wo.weight"] = take(hf + "self_attn.o_proj.weight")
        state[ours + "feed_forward.w13.weight"] = torch.cat(
            [take(hf + "mlp.gate_proj.weight"), take(hf + "mlp.up_proj.weight")]
        )
        state[ours + "feed_forward.w2.weight"] = take(hf + "mlp.down_proj.weight")
        state[ours + "attention_norm.weight"] = take(hf + "input_layernorm.weight")
        state[ours + "ffn_norm.weight"] = take(hf + "post_attention_layernorm.weight")
    return state
