"""Which files of a Hub repository the chat needs, chosen from its listing: one GGUF
quantisation (every part of a split one), or a safetensors checkpoint's config, tokenizer
and shards (never the .bin, .pth or ONNX copies of the same weights).

A listing comes from a stranger (a mirror, `HF_ENDPOINT`): every name is checked before
it is used, and a listing longer than a repository plausibly holds is refused.
"""

from __future__ import annotations

import re

import gguf
from dataclasses import dataclass

from llama_chat.errors import LlamaChatError
from llama_chat.models.names import HubName, check_repo_path

MOST_FILES = 20_000  # the largest GGUF collections hold a few hundred files
DEFAULT_QUANT = "Q4_K_M"

# A quantisation's name in a file name: a GGML block type (Q4_0, Q6_K, IQ4_XS, BF16), or
# llama.cpp's mix of one (Q4_K_M: mostly Q4_K, some tensors wider).
_QUANT_IN_NAME = re.compile(
    r"(?<![A-Za-z0-9])(IQ\d_(?:XXS|XS|NL|S|M)|Q\d_K(?:_(?:XL|S|M|L))?|Q\d_[01]|TQ\d_0|MXFP4|BF16|F16|F32)"
    r"(?![A-Za-z0-9])",
    re.IGNORECASE,
)
# Where a mix sits beside its block type: llama.cpp's _S, _M and _L mixes widen more tensors in turn.
_MIX_OFFSET = {"XXS": -0.2, "XS": -0.1, "S": 0.0, "M": 0.1, "L": 0.2, "XL": 0.3}
SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# What a Hugging Face checkpoint folder needs besides its weights (checkpoints/hf.py reads these).
CHECKPOINT_FILES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "model.safetensors.index.json",
    "added_tokens.json", "vocab.json", "merges.txt",
})


@dataclass(frozen=True)
class RepoFile:
    """One file of a listing: its path in the repository, size, and sha256 where the hub
    keeps it in large-file storage (GGUF and safetensors files always are)."""

    path: str
    size: int
    sha256: str | None = None


@dataclass(frozen=True)
class Choice:
    """The files to fetch, the one the readers open (a GGUF file, a split file's first part,
    or the folder's config.json), and a line saying what was chosen where the name left it open."""

    files: tuple[RepoFile, ...]
    entry: str
    note: str | None = None


def checked_listing(files: list[RepoFile], repo: str) -> list[RepoFile]:
    """The listing, every name and size checked (UsageError, in one line, for the first that is not)."""
    if len(files) > MOST_FILES:
        raise LlamaChatError(f"{repo}: the hub lists {len(files)} files, more than a model repository holds; "
                             "refused (is HF_ENDPOINT a hub you trust?)")
    for file in files:
        check_repo_path(file.path, repo, LlamaChatError)
        if not 0 <= file.size < 1 << 50:
            raise LlamaChatError(f"{repo}: the hub gives {file.path} a size of {file.size}; refused")
        if file.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", file.sha256):
            raise LlamaChatError(f"{repo}: the hub gives {file.path} a malformed sha256; refused")
    return files


def bits_per_weight(quant: str) -> float:
    """About how many bits a weight takes in this quantisation: its block type's (from the
    gguf package's block sizes), a mix placed beside it; 99 for a name not known."""
    sizes = {kind.name: 8 * size / block for kind, (block, size) in gguf.GGML_QUANT_SIZES.items()}
    if quant in sizes:
        return sizes[quant]
    base, _, mix = quant.rpartition("_")
    for block_type in (base, f"{base}_S"):
        if block_type in sizes and mix in _MIX_OFFSET:
            return sizes[block_type] + _MIX_OFFSET[mix]
    return 99.0


def quant_of(path: str) -> str | None:
    """The quantisation a GGUF file's name says it holds (upper case), if any."""
    found = _QUANT_IN_NAME.findall(path.rsplit("/", 1)[-1]) or _QUANT_IN_NAME.findall(path)
    return found[-1].upper() if found else None


def choose(files: list[RepoFile], name: HubName) -> Choice:
    """The files `name` asks for from this listing (LlamaChatError naming what the repository
    offers where nothing fits)."""
    if name.file is not None:
        return _named_file(files, name)
    ggufs = [file for file in files if _is_model_gguf(file.path)]
    if ggufs:
        return _quantisation(ggufs, files, name)
    if name.quant is not None:
        raise LlamaChatError(f"{name.repo_id} holds no GGUF files, so there is no :{name.quant} to choose; "
                             f"name the repository alone")
    return _checkpoint(files, name.repo_id)


def _is_model_gguf(path: str) -> bool:
    """A GGUF file of a model's weights: not a vision projector (mmproj), not a later part of a split file."""
    base = path.rsplit("/", 1)[-1].lower()
    if not base.endswith(".gguf") or base.startswith("mmproj") or "-mmproj" in base:
        return False
    part = SPLIT_PART.search(base)
    return part is None or int(part.group(1)) == 1


def with_parts(first: RepoFile, files: list[RepoFile], repo: str) -> tuple[RepoFile, ...]:
    """A GGUF file and, where it is the first part of a split file, every part in order."""
    part = SPLIT_PART.search(first.path)
    if part is None:
        return (first,)
    count = int(part.group(2))
    stem = first.path[: part.start()]
    by_path = {file.path: file for file in files}
    parts = []
    for number in range(1, count + 1):
        wanted = f"{stem}-{number:05d}-of-{count:05d}.gguf"
        found = by_path.get(wanted) or next((f for f in files if f.path.lower() == wanted.lower()), None)
        if found is None:
            raise LlamaChatError(f"{repo}: {first.path} is split in {count} parts, but part {number} is not "
                                 "in the repository")
        parts.append(found)
    return tuple(parts)


def _named_file(files: list[RepoFile], name: HubName) -> Choice:
    found = next((file for file in files if file.path == name.file), None)
    if found is None:
        offered = ", ".join(sorted(file.path for file in files if _is_model_gguf(file.path))[:12])
        raise LlamaChatError(f"{name.repo_id} has no file {name.file}" + (f"; its GGUF files: {offered}" if offered
                                                                          else ""))
    if not found.path.lower().endswith(".gguf"):
        raise LlamaChatError(f"{name.repo_id}/{name.file}: one file is a GGUF file's to name; name the repository "
                             "alone for a safetensors checkpoint")
    return Choice(with_parts(found, files, name.repo_id), found.path)


def _quantisation(ggufs: list[RepoFile], files: list[RepoFile], name: HubName) -> Choice:
    """The GGUF file of the quantisation asked for, else Q4_K_M, else the nearest above 4 bits."""
    by_quant: dict[str, list[RepoFile]] = {}
    for file in ggufs:
        by_quant.setdefault(quant_of(file.path) or "?", []).append(file)
    offered = sorted((q for q in by_quant if q != "?"), key=bits_per_weight)
    note = None
    if name.quant is not None:
        wanted = name.quant.upper()
        if wanted not in by_quant:
            raise LlamaChatError(f"{name.repo_id} offers no {name.quant} file; it offers "
                                 f"{', '.join(offered) or 'GGUF files without a quantisation in their names'}")
    elif DEFAULT_QUANT in by_quant:
        wanted = DEFAULT_QUANT
    elif len(ggufs) == 1:
        wanted = quant_of(ggufs[0].path) or "?"
    else:
        above = [q for q in offered if bits_per_weight(q) > 4]
        wanted = above[0] if above else (offered[-1] if offered else "?")
        if wanted == "?" and len(by_quant["?"]) > 1:
            raise LlamaChatError(f"{name.repo_id} holds {len(ggufs)} GGUF files and their names give no quantisation: "
                                 f"name one as {name.repo_id}/FILE ({', '.join(f.path for f in ggufs[:8])})")
        note = (f"{name.repo_id} has no {DEFAULT_QUANT} file; took {wanted}, the nearest above 4 bits "
                f"({name.repo_id}:QUANT names another of {', '.join(offered)})")
    candidates = sorted(by_quant[wanted], key=lambda file: (file.path.count("/"), len(file.path), file.path))
    first = candidates[0]
    return Choice(with_parts(first, files, name.repo_id), first.path, note)


def _checkpoint(files: list[RepoFile], repo: str) -> Choice:
    """A safetensors checkpoint: its top-level config, tokenizer files and shards."""
    top = [file for file in files if "/" not in file.path]
    if not any(file.path == "config.json" for file in top):
        raise LlamaChatError(f"{repo} holds neither GGUF files nor a config.json: not a model llama-chat can run")
    shards = [file for file in top if file.path.endswith(".safetensors")]
    if not shards:
        raise LlamaChatError(f"{repo} has no .safetensors weights (llama-chat does not read .bin or .pth files "
                             "from the hub: they can run code); look for a safetensors or GGUF version")
    wanted = [file for file in top if file.path in CHECKPOINT_FILES] + shards
    return Choice(tuple(sorted(wanted, key=lambda file: file.path)), "config.json")
