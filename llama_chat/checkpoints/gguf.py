"""GGUF checkpoints (llama.cpp's format): a file's metadata checked and read into
hyper-parameters (gguf_config), a tokenizer, and weights (gguf_tensors). The header is read
by gguf_file; a model split in parts (gguf-split's NAME-00001-of-00003.gguf, ...) is
gathered from its parts by gguf_split.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llama_chat.checkpoints import sampling_defaults
from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.gguf_config import args_from_gguf_metadata
from llama_chat.checkpoints.gguf_file import MAGIC as GGUF_MAGIC  # noqa: F401 (detect.py's, from here)
from llama_chat.checkpoints.gguf_file import TensorInfo
from llama_chat.checkpoints.gguf_split import read_gguf_model
from llama_chat.checkpoints.gguf_tensors import (
    LONGROPE_FACTORS,
    ROPE_FREQS,
    check_tensor_types,
    convert_gguf_tensors,
    read_vector,
)
from llama_chat.checkpoints.values import of_type
from llama_chat.untrusted_files import shown
from llama_chat.errors import LlamaChatError, first_line
from llama_chat.text import tokenizer_cache
from llama_chat.text.gguf_tokenizer import tokenizer_from_gguf_metadata
from llama_chat.text.tokenizer_cache import KeptTokenizer

# The architectures llama-chat reads from GGUF (Mistral's files say llama); their
# hyper-parameters sit under the architecture's name (qwen2.block_count, ...).
ARCHITECTURES = ("llama", "qwen2", "qwen3", "granite", "phi3", "gemma2", "gemma3")
# Those whose q/k rows llama.cpp's converter keeps as the checkpoint has them (rotating
# halves); it stores the others' in the interleaved rotary layout.
HALF_ROTARY = frozenset({"qwen2", "qwen3", "phi3", "gemma2", "gemma3"})
# The vocabulary's arrays: only a tokenizer is made of them, so a kept one leaves them unread.
VOCABULARY_ARRAYS = frozenset(
    f"tokenizer.ggml.{name}" for name in ("tokens", "scores", "token_type", "merges")
)


def load_gguf(path: str | Path) -> Checkpoint:
    """Read a GGUF file's metadata and tokenizer (an architecture of ARCHITECTURES), or a
    split model's, named by its first part; its weights are read when the loader asks for them.
    The tokenizer comes from the cache folder after the file's first load (tokenizer_cache)."""
    source = str(path)
    path = Path(path)
    if not path.is_file():
        raise LlamaChatError(f"{path}: no such file")
    entry = tokenizer_cache.tokenizer_entry(path)
    kept = tokenizer_cache.read(entry) if entry is not None else None
    metadata, stored, _ = read_gguf_model(path, VOCABULARY_ARRAYS if kept is not None else frozenset())
    _check_metadata_types(metadata, source)
    architecture = metadata.get("general.architecture")
    if architecture not in ARCHITECTURES:
        raise LlamaChatError(f"{source} is a {shown(architecture)} model; llama-chat runs "
                             f"{', '.join(ARCHITECTURES)} models")
    check_tensor_types(stored, source)
    if kept is None:
        kept = _tokenizer(metadata, source)
        if entry is not None:
            tokenizer_cache.write(entry, kept)
    for warning in kept.warnings:
        warnings.warn(warning, stacklevel=2)
    factors = {name: read_vector(stored[name]).double()
               for name in (ROPE_FREQS, *LONGROPE_FACTORS) if name in stored}
    args = args_from_gguf_metadata(
        metadata,
        vocab_size=kept.vocabulary_size,
        tie_embeddings="output.weight" not in stored,
        rope_factors=factors,
        source=source,
    )
    tensors = convert_gguf_tensors(stored, args, source, interleaved_rotary=architecture not in HALF_ROTARY)
    return Checkpoint(
        args=args,
        tensors=tensors,
        tokenizer=kept.tokenizer,
        chat_template=metadata.get("tokenizer.chat_template"),
        bos_token=kept.bos_token,
        eos_token=kept.eos_token,
        source_quantization=_layer_weight_type(stored),
        sampling=sampling_defaults.from_gguf(metadata),
        names=tuple(value for key in ("general.basename", "general.name") if isinstance(value := metadata.get(key), str)),
    )


def _tokenizer(metadata: Mapping[str, Any], source: str) -> KeptTokenizer:
    """The tokenizer the file's vocabulary makes, with what the loader takes from the vocabulary
    and what making it warned of (said by load_gguf, at this load and each later one)."""
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            tokenizer = tokenizer_from_gguf_metadata(metadata, source)
    except LlamaChatError:
        raise
    except Exception as error:  # noqa: BLE001 (tokenizers refuses a vocabulary with plain Exceptions)
        raise LlamaChatError(f"{source}: its tokenizer metadata makes no tokenizer ({first_line(error)})") from None
    tokens = metadata["tokenizer.ggml.tokens"]
    return KeptTokenizer(
        tokenizer, len(tokens),
        bos_token=tokens[tokenizer.bos_id] if tokenizer.bos_id is not None else None,
        eos_token=tokens[tokenizer.eos_id] if tokenizer.eos_id is not None else None,
        warnings=tuple(str(warning.message) for warning in warned),
    )


def _layer_weight_type(stored: Mapping[str, TensorInfo]) -> str:
    """The type most of the blocks' matrices are stored as."""
    types = Counter(t.tensor_type.name for name, t in stored.items() if name.startswith("blk.") and len(t.shape) == 2)
    return types.most_common(1)[0][0] if types else "F32"


# The types of the metadata llama-chat reads, other than the hyper-parameters (checked
# where they are read). A GGUF array holds one element type, so its first element tells.
_METADATA_TYPES: dict[str, tuple[type, type | None]] = {
    "general.architecture": (str, None),
    "tokenizer.chat_template": (str, None),
    **{f"{architecture}.rope.scaling.type": (str, None) for architecture in ARCHITECTURES},
    "tokenizer.ggml.model": (str, None),
    "tokenizer.ggml.pre": (str, None),
    "tokenizer.ggml.tokens": (list, str),
    "tokenizer.ggml.merges": (list, str),
    "tokenizer.ggml.token_type": (list, int),
    "tokenizer.ggml.scores": (list, float),
    "tokenizer.ggml.add_bos_token": (bool, None),
    "tokenizer.ggml.add_space_prefix": (bool, None),
    **{f"tokenizer.ggml.{role}_token_id": (int, None) for role in ("bos", "eos", "unknown", "eot", "eom")},
}


def _check_metadata_types(metadata: Mapping[str, Any], source: str) -> None:
    """Refuse, naming the key, metadata llama-chat reads that holds a value of another type."""
    for key, (kind, element_kind) in _METADATA_TYPES.items():
        value = metadata.get(key)
        if value is None:
            continue
        of_type(value, kind, key, source)
        if element_kind is not None and value:
            of_type(value[0], element_kind, f"{key}[0]", source)
