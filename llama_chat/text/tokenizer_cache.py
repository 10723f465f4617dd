"""Tokenizers built from a model file, kept in the cache folder so that only a first start builds them.

Building the tokenizer of a large GGUF vocabulary takes seconds (Gemma 3's 262,144 tokens:
half a million merges derived from the scores, then indexed by the tokenizers library);
reading it back from the library's own JSON takes a fraction of that, and the reader then
steps over the vocabulary in the file's header instead of making Python strings of it.

An entry is one line of llama-chat's own JSON (the tokenizer's settings and what a reader
takes from the vocabulary) followed by the library's JSON of the tokenizer, keyed by the
model file's identity and the code that builds tokenizers, so a changed file or builder
is never served an old tokenizer. Both parts are read by JSON parsers, nothing in them
runs; an entry that does not read back is removed, with one line, and built again.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import tokenizers

from llama_chat import disk_cache
from llama_chat.process_memory import return_freed_memory
from llama_chat.text.hf_tokenizer import HFTokenizer

FORMAT = 1
# Code whose output an entry holds (paths inside llama_chat/): a change to any of it builds anew.
BUILDER_SOURCES = ("text/gguf_tokenizer.py", "text/hf_tokenizer.py", "text/tokenizer_cache.py")


@dataclass(frozen=True)
class KeptTokenizer:
    """A tokenizer with what a reader takes from the vocabulary it was built from."""

    tokenizer: HFTokenizer
    vocabulary_size: int  # the tokens the file lists (the model's embedding rows)
    bos_token: str | None
    eos_token: str | None
    warnings: tuple[str, ...] = ()  # what building it warned of (a text split unknown), for every load to say


def tokenizer_entry(source: Path) -> Path | None:
    """Where the tokenizer built from the model file `source` is kept; None when the cache is
    off, or the file cannot be read (its reader then says why)."""
    folder = disk_cache.entry_path("tokenizers")
    if folder is None:
        return None
    try:
        identity = disk_cache.file_identity(source)
    except OSError:
        return None
    spec = {
        "source": identity,
        "code": disk_cache.code_digests(BUILDER_SOURCES),
        "tokenizers": tokenizers.__version__,
    }
    # Named by the file's path, then by everything it depends on: writing a new entry for
    # the path removes the old ones (a file replaced, a builder changed).
    return folder / f"{disk_cache.cache_key(str(source.resolve()), 12)}-{disk_cache.cache_key(spec)}.json"


def read(path: Path) -> KeptTokenizer | None:
    """The tokenizer kept at `path`; None when there is none, or when it does not read back
    (then removed, with one line on stderr)."""
    if not path.is_file():
        return None
    # The library refuses a damaged JSON with a plain Exception.
    kept, damage = disk_cache.read_checked([path], lambda: _read(path), damage=(Exception,))
    if damage:
        print(f"llama-chat: the kept tokenizer {path} did not read back ({damage}); building it again",
              file=sys.stderr)
    return kept


def write(path: Path, kept: KeptTokenizer) -> None:
    """Keep `kept` at `path`, whole or not at all, in the place of the entries of an older
    file or builder at the same path. An unwritable cache only means building the tokenizer
    again next time."""
    tokenizer = kept.tokenizer
    settings = {
        "format": FORMAT, "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id,
        "end_of_turn_ids": sorted(tokenizer.end_of_turn_ids), "add_bos_token": tokenizer.add_bos_token,
        "add_prefix_space": tokenizer.add_prefix_space, "vocab_size": tokenizer.vocab_size,
        "vocabulary_size": kept.vocabulary_size, "bos_token": kept.bos_token, "eos_token": kept.eos_token,
        "warnings": list(kept.warnings),
    }
    try:
        with disk_cache.staged(path) as staging:
            # Compact JSON escapes every line break in a string: the settings line ends at the file's only one.
            staging.write_text(json.dumps(settings) + "\n" + tokenizer.tokenizer.to_str(), encoding="utf-8")
    except OSError:
        return
    same_path = path.name.partition("-")[0]
    disk_cache.remove(older for older in path.parent.glob(f"{same_path}-*.json") if older != path)


def _read(path: Path) -> KeptTokenizer:
    with path.open("rb") as file:
        settings, library_json = json.loads(file.readline()), file.read()
    if not isinstance(settings, dict) or settings.get("format") != FORMAT:
        raise ValueError("not a kept tokenizer of this version")
    wrong = [name for name, holds in _SETTINGS.items() if not holds(settings.get(name))]
    if wrong:
        raise ValueError(f"its {wrong[0]} is not what it should be")
    backend = tokenizers.Tokenizer.from_buffer(library_json)
    return_freed_memory()  # the parse's temporaries: 340 MB for Gemma 3's, five times the tokenizer
    tokenizer = HFTokenizer(
        backend, bos_id=settings["bos_id"], eos_id=settings["eos_id"], end_of_turn_ids=settings["end_of_turn_ids"],
        add_bos_token=settings["add_bos_token"], add_prefix_space=settings["add_prefix_space"],
        vocab_size=settings["vocab_size"],
    )
    return KeptTokenizer(tokenizer, settings["vocabulary_size"], settings["bos_token"], settings["eos_token"],
                         tuple(settings["warnings"]))


def _whole(value: object) -> bool:
    return type(value) is int and value >= 0


def _whole_or_none(value: object) -> bool:
    return value is None or _whole(value)


def _text_or_none(value: object) -> bool:
    return value is None or isinstance(value, str)


# What each setting `write` keeps holds, checked before any is used.
_SETTINGS = {
    "bos_id": _whole_or_none, "eos_id": _whole_or_none,
    "end_of_turn_ids": lambda value: isinstance(value, list) and all(map(_whole, value)),
    "add_bos_token": lambda value: isinstance(value, bool), "add_prefix_space": lambda value: isinstance(value, bool),
    "vocab_size": _whole, "vocabulary_size": _whole, "bos_token": _text_or_none, "eos_token": _text_or_none,
    "warnings": lambda value: isinstance(value, list) and all(isinstance(warning, str) for warning in value),
}
