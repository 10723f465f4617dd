"""Hugging Face Llama checkpoints: config.json hyper-parameters, tensor names, and whole directories.

A directory holds config.json, the weights (model.safetensors, sharded safetensors
with an index, or pytorch_model.bin), a tokenizer (tokenizer.json or tokenizer.model),
and optionally tokenizer_config.json, generation_config.json and a chat template.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import torch

from llama_chat.checkpoints import sampling_defaults
from llama_chat.checkpoints.contents import Checkpoint, Weight
from llama_chat.checkpoints.hf_weight_files import weight_files
from llama_chat.checkpoints.json_file import read_json_object
from llama_chat.checkpoints.stored import TensorMatrix
from llama_chat.checkpoints.tensor_names import TensorNames, assemble_state_dict, expected_shapes
from llama_chat.checkpoints.tokenizer_files import chat_template, hf_tokenizer, token_content
from llama_chat.engine.config import ModelArgs, RopeScaling
from llama_chat.errors import LlamaChatError

SUPPORTED_MODEL_TYPES = ("llama", "mistral")  # mistral: the same blocks, maybe a sliding window


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


HF_NAMES = TensorNames(
    embeddings="model.embed_tokens.weight",
    norm="model.norm.weight",
    output="lm_head.weight",
    q="model.layers.{i}.self_attn.q_proj.weight",
    k="model.layers.{i}.self_attn.k_proj.weight",
    v="model.layers.{i}.self_attn.v_proj.weight",
    o="model.layers.{i}.self_attn.o_proj.weight",
    gate="model.layers.{i}.mlp.gate_proj.weight",
    up="model.layers.{i}.mlp.up_proj.weight",
    down="model.layers.{i}.mlp.down_proj.weight",
    attention_norm="model.layers.{i}.input_layernorm.weight",
    ffn_norm="model.layers.{i}.post_attention_layernorm.weight",
)


def convert_hf_state_dict(tensors: Mapping[str, Weight], args: ModelArgs) -> dict[str, Weight]:
    """Hugging Face tensor names to this project's (q and k rows are already half-split)."""

    def take(name: str) -> Weight:
        try:
            weight = tensors[name]
        except KeyError:
            raise LlamaChatError(f"checkpoint is missing tensor {name!r}") from None
        return TensorMatrix.of(weight) if isinstance(weight, torch.Tensor) and weight.ndim == 2 else weight

    return assemble_state_dict(args, HF_NAMES, take, interleaved_rotary=False)


def load_hf_directory(path: str | Path) -> Checkpoint:
    """Load a Hugging Face model directory (Llama architecture) with its tokenizer and chat template."""
    directory = Path(path)
    config_path = directory / "config.json"
    config = read_json_object(config_path)
    if config is None:
        raise LlamaChatError(f"{config_path}: no such file (a Hugging Face model directory has config.json)")
    args = _checked_args(config, config_path)
    tensors = convert_hf_state_dict(weight_files(directory, expected_shapes(args, HF_NAMES)), args)
    tokenizer_config = read_json_object(directory / "tokenizer_config.json") or {}
    generation_config = read_json_object(directory / "generation_config.json") or {}
    end_ids = _id_set(generation_config.get("eos_token_id")) | _id_set(config.get("eos_token_id"))
    tokenizer = hf_tokenizer(directory, tokenizer_config, end_ids)
    return Checkpoint(
        args=args,
        tensors=tensors,
        tokenizer=tokenizer,
        chat_template=chat_template(directory, tokenizer_config),
        bos_token=token_content(tokenizer_config.get("bos_token")) or tokenizer.token_name(tokenizer.bos_id),
        eos_token=token_content(tokenizer_config.get("eos_token")) or tokenizer.token_name(tokenizer.eos_id),
        source_quantization=(config.get("llama_chat") or {}).get("source_quantization"),
        sampling=sampling_defaults.from_generation_config(generation_config),
    )


def _checked_args(config: Mapping, config_path: Path) -> ModelArgs:
    """ModelArgs for a config.json, refusing what the Llama blocks cannot run."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise LlamaChatError(
            f"{config_path}: model_type {model_type!r} is not supported: "
            f"llama-chat runs Llama-architecture models ({', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method", "quantized")
        raise LlamaChatError(f"{config_path}: {method} weights are not supported: use a float16/bfloat16 model")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise LlamaChatError(f"{config_path}: projection biases are not supported by llama-chat's Llama blocks")
    if config.get("hidden_act", "silu") != "silu":
        raise LlamaChatError(f"{config_path}: activation {config['hidden_act']!r} is not supported (only silu)")
    args = args_from_hf_config(config)
    window = config.get("sliding_window")
    if window and window < args.max_seq_len:
        # Within the window, sliding-window attention is plain causal attention.
        args = dataclasses.replace(args, max_seq_len=window)
    return args


def _id_set(value: object) -> set[int]:
    """eos_token_id of a config: one id, a list of ids, or nothing."""
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {i for i in value if isinstance(i, int)}
    return set()
