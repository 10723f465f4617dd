"""Hugging Face Llama checkpoints: config.json hyper-parameters, tensor names, and whole directories.

A directory holds config.json, the weights (model.safetensors, sharded safetensors
with an index, or pytorch_model.bin), a tokenizer (tokenizer.json or tokenizer.model),
and optionally tokenizer_config.json, generation_config.json and a chat template.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import tokenizers
import torch

from llama_chat.checkpoints.checkpoint import (
    Checkpoint,
    TensorNames,
    Weight,
    assemble_state_dict,
    checked_float,
    expected_shapes,
    read_json_object,
)
from llama_chat.checkpoints.meta import load_tokenizer_model, load_torch_file
from llama_chat.checkpoints.safetensors_file import DTYPES as SAFETENSORS_FLOAT_TYPES
from llama_chat.checkpoints.safetensors_file import SafetensorsFile
from llama_chat.checkpoints.stored import TensorMatrix
from llama_chat.engine.config import ModelArgs, RopeScaling
from llama_chat.errors import LlamaChatError
from llama_chat.text.fast_tokenizer import BPETokenizer
from llama_chat.text.tokenizer import Tokenizer

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
    tensors = convert_hf_state_dict(_weight_files(directory, args), args)
    tokenizer_config = read_json_object(directory / "tokenizer_config.json") or {}
    generation_config = read_json_object(directory / "generation_config.json") or {}
    end_ids = _id_set(generation_config.get("eos_token_id")) | _id_set(config.get("eos_token_id"))
    tokenizer = _load_tokenizer(directory, tokenizer_config, end_ids)
    return Checkpoint(
        args=args,
        tensors=tensors,
        tokenizer=tokenizer,
        chat_template=_chat_template(directory, tokenizer_config),
        bos_token=_token_content(tokenizer_config.get("bos_token")) or tokenizer.token_name(tokenizer.bos_id),
        eos_token=_token_content(tokenizer_config.get("eos_token")) or tokenizer.token_name(tokenizer.eos_id),
        source_quantization=(config.get("llama_chat") or {}).get("source_quantization"),
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


class WeightFiles(Mapping):
    """The tensors of a directory's weight files by name: vectors read when asked for,
    matrices as TensorMatrix whose rows are read (by plain reads from a safetensors file,
    from the memory map of a .bin one) only when the loader packs or converts them. Every
    shape is checked against config.json.
    """

    def __init__(
        self, directory: Path, locations: Mapping[str, Path], expected_shapes: Mapping[str, tuple[int, ...]],
        opened: Mapping[Path, object] | None = None,
    ) -> None:
        self._directory = directory
        self._locations = dict(locations)
        self._expected = expected_shapes
        self._opened: dict[Path, object] = dict(opened or {})  # files already open, by path

    def __getitem__(self, name: str) -> Weight:
        if name not in self._locations:
            raise LlamaChatError(f"{self._directory}: the weight files have no tensor {name!r}")
        path = self._locations[name]
        source = self._open(path)
        if isinstance(source, dict):  # a PyTorch file, already memory-mapped
            tensor = checked_float(source[name], name, path)
            self._check_shape(name, tuple(tensor.shape), path)
            return TensorMatrix.of(tensor) if tensor.ndim == 2 else tensor
        if name not in source:
            raise LlamaChatError(f"{path}: has no tensor {name!r}, though the weight index says it does")
        shape, dtype = source.shape(name), source.dtype_name(name)
        self._check_shape(name, shape, path)
        if dtype not in SAFETENSORS_FLOAT_TYPES:
            raise LlamaChatError(
                f"{path}: tensor {name!r} is {dtype}; llama-chat loads float32, float16 or bfloat16 weights"
            )
        if len(shape) == 2:
            return TensorMatrix(shape, lambda start, stop: source.rows(name, start, stop), source.nbytes(name))
        return source.rows(name)

    def __contains__(self, name: object) -> bool:
        return name in self._locations  # without reading the tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._locations)

    def __len__(self) -> int:
        return len(self._locations)

    def _check_shape(self, name: str, shape: tuple[int, ...], path: Path) -> None:
        expected = self._expected.get(name)
        if expected is not None and shape != expected:
            raise LlamaChatError(f"{path}: tensor {name!r} has shape {shape} but config.json implies {expected}")

    def _open(self, path: Path):
        if path not in self._opened:
            if not path.is_file():
                raise LlamaChatError(f"{path}: no such file, though the weight index names it")
            self._opened[path] = load_torch_file(path) if path.suffix == ".bin" else SafetensorsFile(path)
        return self._opened[path]


def _weight_files(directory: Path, args: ModelArgs) -> WeightFiles:
    """Where each tensor of the directory lives: sharded (an index file) or in one file."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index_path = directory / index_name
        index = read_json_object(index_path)
        if index is None:
            continue
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            raise LlamaChatError(f"{index_path}: has no weight_map")
        locations = {name: directory / file for name, file in weight_map.items()}
        return WeightFiles(directory, locations, expected_shapes(args, HF_NAMES))
    safetensors_path = directory / "model.safetensors"
    if safetensors_path.is_file():
        opened = SafetensorsFile(safetensors_path)
        return WeightFiles(directory, dict.fromkeys(opened.keys(), safetensors_path),
                           expected_shapes(args, HF_NAMES), {safetensors_path: opened})
    bin_path = directory / "pytorch_model.bin"
    if bin_path.is_file():
        opened = load_torch_file(bin_path)  # memory-mapped where the file allows it
        return WeightFiles(directory, dict.fromkeys(opened, bin_path), expected_shapes(args, HF_NAMES),
                           {bin_path: opened})
    raise LlamaChatError(
        f"{directory}: no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)"
    )


def _load_tokenizer(directory: Path, tokenizer_config: Mapping, end_ids: Iterable[int]) -> Tokenizer:
    """tokenizer.json when present (it carries the exact pre-tokenizer), else tokenizer.model."""
    json_path = directory / "tokenizer.json"
    if json_path.is_file():
        return tokenizer_from_tokenizer_json(json_path, tokenizer_config, end_ids)
    model_path = directory / "tokenizer.model"
    if model_path.is_file():
        return load_tokenizer_model(
            model_path,
            special_tokens(tokenizer_config),
            bos_token=_token_content(tokenizer_config.get("bos_token")),
            eos_token=_token_content(tokenizer_config.get("eos_token")),
            end_of_turn_ids=end_ids,
            add_bos_token=tokenizer_config.get("add_bos_token", True),
        )
    raise LlamaChatError(f"{directory}: no tokenizer (tokenizer.json or tokenizer.model)")


def tokenizer_from_tokenizer_json(
    path: Path, tokenizer_config: Mapping, end_of_turn_ids: Iterable[int] = ()
) -> BPETokenizer:
    """A tokenizer.json with the bos/eos names and add_bos_token of its tokenizer_config.json."""
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers reports every parse failure as a plain Exception
        raise LlamaChatError(f"{path}: not a readable tokenizer.json ({error})") from None
    bos_name = _token_content(tokenizer_config.get("bos_token"))
    eos_name = _token_content(tokenizer_config.get("eos_token"))
    bos_id = backend.token_to_id(bos_name) if bos_name else None
    add_bos_token = tokenizer_config.get("add_bos_token")
    if add_bos_token is None:
        # Not configured: the tokenizer's own post-processor says whether it adds bos.
        add_bos_token = bos_id is not None and backend.encode("a").ids[:1] == [bos_id]
    return BPETokenizer(
        backend,
        bos_id=bos_id,
        eos_id=backend.token_to_id(eos_name) if eos_name else None,
        end_of_turn_ids=end_of_turn_ids,
        add_bos_token=bool(add_bos_token),
    )


def special_tokens(tokenizer_config: Mapping) -> dict[str, int]:
    """The special tokens of a tokenizer_config.json's added_tokens_decoder, name to id."""
    decoder = tokenizer_config.get("added_tokens_decoder") or {}
    return {
        entry["content"]: int(token_id)
        for token_id, entry in decoder.items()
        if isinstance(entry, dict) and entry.get("special", False) and "content" in entry
    }


def _chat_template(directory: Path, tokenizer_config: Mapping) -> str | None:
    """The model's chat template: from tokenizer_config.json, else chat_template.jinja / .json."""
    template = tokenizer_config.get("chat_template")
    if template is None:
        jinja_path = directory / "chat_template.jinja"
        if jinja_path.is_file():
            return jinja_path.read_text(encoding="utf-8")
        template = (read_json_object(directory / "chat_template.json") or {}).get("chat_template")
    if isinstance(template, list):
        # Several named templates (e.g. "default" and "tool_use"): chat uses the default one.
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _token_content(token: object) -> str | None:
    """A tokenizer_config.json token: a plain string or an AddedToken dict with "content"."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) and token else None


def _id_set(value: object) -> set[int]:
    """eos_token_id of a config: one id, a list of ids, or nothing."""
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {i for i in value if isinstance(i, int)}
    return set()
