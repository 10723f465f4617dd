"""Hugging Face Llama checkpoints: config.json hyper-parameters, tensor names, and whole directories.

A directory holds config.json, the weights (model.safetensors, sharded safetensors
with an index, or pytorch_model.bin), a tokenizer (tokenizer.json or tokenizer.model),
and optionally tokenizer_config.json, generation_config.json and a chat template.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path

import torch

from llama_chat.checkpoints import sampling_defaults
from llama_chat.checkpoints.contents import Checkpoint, Weight
from llama_chat.checkpoints.hf_weight_files import weight_files
from llama_chat.untrusted_files import read_json_object
from llama_chat.checkpoints.stored import TensorMatrix
from llama_chat.checkpoints.tensor_names import TensorNames, assemble_state_dict, expected_shapes
from llama_chat.checkpoints.tokenizer_files import chat_template, hf_tokenizer, token_content
from llama_chat.checkpoints.values import (
    context_length,
    layer_count,
    of_type,
    positive_number,
    real_number,
    shown,
    whole_number,
)
from llama_chat.engine.config import ARCHITECTURE_SWITCHES, ModelArgs, RopeScaling
from llama_chat.errors import LlamaChatError



def args_from_hf_config(config: Mapping, source: object = "config.json") -> ModelArgs:
    """ModelArgs from the contents of a Hugging Face LlamaConfig (config.json; `source`
    names it in errors), every value's type checked before use."""

    def whole(key: str, value: object) -> int:
        if value is None:
            raise LlamaChatError(f"{source} has no {key!r}: is this a Llama model?")
        return whole_number(value, key, source)

    n_heads = whole("num_attention_heads", config.get("num_attention_heads"))
    dim = whole("hidden_size", config.get("hidden_size"))
    head_dim = whole("head_dim", config.get("head_dim") or dim // n_heads)
    tie_embeddings = config.get("tie_word_embeddings") or False
    max_seq_len = context_length(whole("max_position_embeddings", _given(config, "max_position_embeddings", 2048)),
                                 "max_position_embeddings", source)
    scaling = config.get("rope_scaling") or config.get("rope_parameters")
    parameters = scaling if isinstance(scaling, dict) else {}
    partial = real_number(_given(config, "partial_rotary_factor", parameters.get("partial_rotary_factor", 1.0)),
                          "partial_rotary_factor", source)
    if not 0 < partial <= 1:
        raise LlamaChatError(f"{source}: partial_rotary_factor is {partial}; a share of each head from 0 to 1 belongs")
    model_type = str(config.get("model_type"))
    return ModelArgs(
        dim=dim,
        n_layers=layer_count(whole("num_hidden_layers", config.get("num_hidden_layers")), "num_hidden_layers", source),
        n_heads=n_heads,
        n_kv_heads=whole("num_key_value_heads", config.get("num_key_value_heads") or n_heads),
        head_dim=head_dim,
        rotary_dim=int(head_dim * partial),  # as transformers rounds it
        vocab_size=whole("vocab_size", config.get("vocab_size")),
        hidden_dim=whole("intermediate_size", config.get("intermediate_size")),
        norm_eps=real_number(_given(config, "rms_norm_eps", 1e-6), "rms_norm_eps", source),
        rope_theta=_rope_theta(config, source),
        rope_scaling=_rope_scaling(scaling, config, max_seq_len, source),
        max_seq_len=max_seq_len,
        tie_embeddings=of_type(tie_embeddings, bool, "tie_word_embeddings", source),
        architecture=model_type,
        **ARCHITECTURE_SWITCHES.get(model_type, {}),
        embedding_scale=real_number(_given(config, "embedding_multiplier", 1.0), "embedding_multiplier", source),
        residual_scale=real_number(_given(config, "residual_multiplier", 1.0), "residual_multiplier", source),
        attention_scale=(real_number(config["attention_multiplier"], "attention_multiplier", source)
                         if config.get("attention_multiplier") is not None else None),
        logit_scale=real_number(_given(config, "logits_scaling", 1.0), "logits_scaling", source),
    )


def _given(config: Mapping, key: str, default: object) -> object:
    """config[key], or `default` where the key is missing or null."""
    value = config.get(key)
    return default if value is None else value


def _rope_theta(config: Mapping, source: object) -> float:
    parameters = config.get("rope_parameters") or {}
    theta = config.get("rope_theta") or (parameters.get("rope_theta") if isinstance(parameters, dict) else None)
    return real_number(theta or 10000.0, "rope_theta", source)


def _rope_scaling(scaling: object, config: Mapping, max_seq_len: int, source: object) -> RopeScaling:
    if not scaling:
        return RopeScaling()
    if not isinstance(scaling, dict):
        raise LlamaChatError(f"{source}: rope_scaling is {shown(scaling)}, where an object belongs")
    kind = scaling.get("rope_type") or scaling.get("type") or "default"

    def given(key: str) -> object:
        if key not in scaling:
            raise LlamaChatError(f"{source}: {kind} rope scaling without its {key!r}")
        return scaling[key]

    def real(key: str) -> float:
        return real_number(given(key), f"rope_scaling's {key}", source)

    if kind == "default":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling(kind="linear", factor=real("factor"))
    original_key = "original_max_position_embeddings"
    if kind == "llama3":
        return RopeScaling(
            kind="llama3", factor=real("factor"), low_freq_factor=real("low_freq_factor"),
            high_freq_factor=real("high_freq_factor"),
            original_max_position_embeddings=whole_number(given(original_key), f"rope_scaling's {original_key}", source),
        )
    if kind == "longrope":
        original = whole_number(scaling.get(original_key) or config.get(original_key) or max_seq_len,
                                original_key, source)
        if original < 2:  # its logarithm divides below
            raise LlamaChatError(f"{source}: {original_key} is {original}; a context of 2 tokens or more belongs")
        # Phi-3's default attention factor, as transformers and llama.cpp's converter derive it.
        factor = real("factor") if scaling.get("factor") is not None else max_seq_len / original
        derived = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
        return RopeScaling(
            kind="longrope", short_factors=_factors(given("short_factor"), "short_factor", source),
            long_factors=_factors(given("long_factor"), "long_factor", source),
            original_max_position_embeddings=original,
            attention_factor=real("attention_factor") if scaling.get("attention_factor") is not None else derived,
        )
    raise LlamaChatError(
        f"{source}: unsupported rope scaling type {shown(kind)}: llama-chat supports linear, llama3 and longrope"
    )


def _factors(values: object, key: str, source: object) -> tuple[float, ...]:
    if not isinstance(values, list):
        raise LlamaChatError(f"{source}: rope_scaling's {key} is {shown(values)}, where a list of numbers belongs")
    return tuple(real_number(value, f"rope_scaling's {key}", source) for value in values)


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
    q_bias="model.layers.{i}.self_attn.q_proj.bias",
    k_bias="model.layers.{i}.self_attn.k_proj.bias",
    v_bias="model.layers.{i}.self_attn.v_proj.bias",
    q_norm="model.layers.{i}.self_attn.q_norm.weight",
    k_norm="model.layers.{i}.self_attn.k_norm.weight",
)
# Phi-3 keeps q, k and v in one projection, and gate and up in one.
FUSED_HF_NAMES = dataclasses.replace(HF_NAMES, qkv="model.layers.{i}.self_attn.qkv_proj.weight",
                                     gate_up="model.layers.{i}.mlp.gate_up_proj.weight")
# Gemma's four norms a layer: its post_attention_layernorm is the norm after attention, not
# Llama's before the feed-forward.
GEMMA_HF_NAMES = dataclasses.replace(
    HF_NAMES, ffn_norm="model.layers.{i}.pre_feedforward_layernorm.weight",
    post_attention_norm="model.layers.{i}.post_attention_layernorm.weight",
    post_ffn_norm="model.layers.{i}.post_feedforward_layernorm.weight",
)
# Hugging Face's model_type where it is not the architecture's name (which GGUF uses).
HF_ARCHITECTURES = {"gemma3_text": "gemma3"}
GEMMA = ("gemma2", "gemma3")


def hf_names(args: ModelArgs) -> TensorNames:
    """The tensor names of a Hugging Face checkpoint of this architecture."""
    if args.sandwich_norms:
        return GEMMA_HF_NAMES
    return FUSED_HF_NAMES if args.architecture == "phi3" else HF_NAMES


def convert_hf_state_dict(tensors: Mapping[str, Weight], args: ModelArgs) -> dict[str, Weight]:
    """Hugging Face tensor names to this project's (q and k rows are already half-split);
    Gemma's norms, which Hugging Face keeps as w and applies as 1 + w, as 1 + w."""

    def take(name: str) -> Weight:
        try:
            weight = tensors[name]
        except KeyError:
            raise LlamaChatError(f"checkpoint is missing tensor {name!r}") from None
        if isinstance(weight, torch.Tensor) and weight.ndim == 2:
            return TensorMatrix.of(weight)
        if args.architecture in GEMMA and name.endswith("norm.weight"):
            return weight.float() + 1  # in float32, as Gemma's norm adds it
        return weight

    return assemble_state_dict(args, hf_names(args), take, interleaved_rotary=False)


def load_hf_directory(path: str | Path) -> Checkpoint:
    """Load a Hugging Face model directory (Llama architecture) with its tokenizer and chat template."""
    directory = Path(path)
    config_path = directory / "config.json"
    config = read_json_object(config_path)
    if config is None:
        raise LlamaChatError(f"{config_path}: no such file (a Hugging Face model directory has config.json)")
    args = _checked_args(config, config_path)
    tensors = convert_hf_state_dict(weight_files(directory, expected_shapes(args, hf_names(args))), args)
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
        source_quantization=_source_quantization(config, config_path),
        sampling=sampling_defaults.from_generation_config(generation_config),
        names=tuple(name for name in (config.get("_name_or_path"), directory.name) if isinstance(name, str)),
    )


def _checked_args(config: Mapping, config_path: Path) -> ModelArgs:
    """ModelArgs for a config.json, refusing what the Llama blocks cannot run."""
    model_type = config.get("model_type")
    if model_type == "gemma3" and "text_config" in config:
        raise LlamaChatError(f"{config_path}: a Gemma 3 folder with its vision model; llama-chat reads a text-only "
                             "one (model_type gemma3_text) or a GGUF file")
    architecture = HF_ARCHITECTURES.get(model_type, model_type) if isinstance(model_type, str) else None
    if architecture not in ARCHITECTURE_SWITCHES:
        raise LlamaChatError(
            f"{config_path}: model_type {shown(model_type)} is not supported: "
            f"llama-chat runs Llama-architecture models ({', '.join(ARCHITECTURE_SWITCHES)})"
        )
    if architecture in GEMMA:
        return _gemma_args(config, architecture, config_path)
    quantization = config.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
        method = method if isinstance(method, str) and method.isprintable() else "quantized"
        raise LlamaChatError(f"{config_path}: {method[:40]} weights are not supported: use a float16/bfloat16 model")
    if config.get("attention_bias") or config.get("mlp_bias"):  # on the output projections too
        raise LlamaChatError(f"{config_path}: projection biases are not supported by llama-chat's Llama blocks")
    if config.get("hidden_act", "silu") != "silu":
        raise LlamaChatError(f"{config_path}: activation {shown(config['hidden_act'])} is not supported (only silu)")
    args = args_from_hf_config(config, config_path)
    window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
    if window and whole_number(window, "sliding_window", config_path) < args.max_seq_len:
        # Within the window, sliding-window attention is plain causal attention.
        args = dataclasses.replace(args, max_seq_len=window)
    return args


def _gemma_args(config: Mapping, architecture: str, config_path: Path) -> ModelArgs:
    """Gemma 2's and 3's config.json: a GELU gate, embeddings scaled by sqrt(dim), scores by
    query_pre_attn_scalar, windowed layers (listed by layer_types, or every layer but the last
    of each run of sliding_window_pattern) with their own rotation, soft caps."""
    activation = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        raise LlamaChatError(f"{config_path}: activation {shown(activation)} is not supported (Gemma's is "
                             "gelu_pytorch_tanh)")
    if config.get("attention_bias") or config.get("use_bidirectional_attention"):
        raise LlamaChatError(f"{config_path}: attention biases or bidirectional attention are not supported")
    # transformers 5 keeps each kind of layer's rotation apart: the global one is the model's.
    rope = config.get("rope_parameters")
    by_kind = rope if isinstance(rope, dict) and "full_attention" in rope else {}
    rope_config = {**config, "rope_parameters": by_kind["full_attention"]} if by_kind else config
    args = args_from_hf_config({**rope_config, "model_type": architecture,
                                "tie_word_embeddings": config.get("tie_word_embeddings", True)}, config_path)
    window = config.get("sliding_window")
    windowed = _windowed_layers(config, architecture, args.n_layers, config_path) if window is not None else ()
    local = (by_kind.get("sliding_attention") or {}).get("rope_theta") or config.get("rope_local_base_freq")
    local = local or (10000.0 if architecture == "gemma3" else None)

    def positive(key: str, value: object) -> float | None:
        return None if value is None else positive_number(value, key, config_path)

    scalar = positive("query_pre_attn_scalar", _given(config, "query_pre_attn_scalar", 256))
    return dataclasses.replace(
        args, embedding_scale=math.sqrt(args.dim), attention_scale=scalar**-0.5,
        sliding_window=whole_number(window, "sliding_window", config_path) if windowed else None,
        windowed_layers=windowed, local_rope_theta=positive("rope_local_base_freq", local),
        attention_softcap=positive("attn_logit_softcapping", config.get("attn_logit_softcapping")),
        logit_softcap=positive("final_logit_softcapping", config.get("final_logit_softcapping")),
    )


def _windowed_layers(config: Mapping, architecture: str, n_layers: int, source: object) -> tuple[bool, ...]:
    kinds = config.get("layer_types")
    if kinds is not None:
        if (not isinstance(kinds, list) or len(kinds) != n_layers
                or not set(kinds) <= {"sliding_attention", "full_attention"}):
            raise LlamaChatError(f"{source}: layer_types must list sliding_attention or full_attention for each of "
                                 f"the {n_layers} layers, got {shown(kinds)}")
        return tuple(kind == "sliding_attention" for kind in kinds)
    pattern = whole_number(_given(config, "sliding_window_pattern", 6 if architecture == "gemma3" else 2),
                           "sliding_window_pattern", source)
    return tuple(bool((layer + 1) % pattern) for layer in range(n_layers))


def _source_quantization(config: Mapping, config_path: Path) -> str | None:
    """What a model converted by llama-chat was quantised as before (its "llama_chat" entry)."""
    ours = config.get("llama_chat") or {}
    quantization = ours.get("source_quantization") if isinstance(ours, dict) else None
    return of_type(quantization, str, "llama_chat.source_quantization", config_path) if quantization else None


def _id_set(value: object) -> set[int]:
    """eos_token_id of a config: one id, a list of ids, or nothing."""
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {i for i in value if isinstance(i, int)}
    return set()
