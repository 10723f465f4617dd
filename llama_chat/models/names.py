"""How a model is named, the same everywhere one is named (--model, /load, --draft, `pull`,
the Python API's `load`): parsed here into what it asks for, without touching the disk
or the network (resolve.py does that).

- a path (kept as given; one that exists always wins, see resolve.py);
- a Hugging Face Hub id: `OWNER/REPO` or `hf:OWNER/REPO`, with `:QUANT` for one GGUF
  quantisation (`:Q4_K_M`, `:q8_0`, as llama.cpp's `-hf` takes it) or `/FILE` for one file,
  and `@REVISION` (a branch, tag or commit);
- `ollama:NAME` (a model ollama pulled), `lmstudio:PUBLISHER/REPO[/FILE]`;
- a short name: what `llama-chat models` lists without a prefix (a file in llama-chat's
  weights folder, a model ollama keeps, a name `llama-chat download` knows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llama_chat.errors import LlamaChatError, UsageError

HUB_PREFIX = "hf:"
OLLAMA_PREFIX = "ollama:"
LMSTUDIO_PREFIX = "lmstudio:"

# The hub's own rule for owner and repository names (letters, digits, '-', '_', '.';
# no '--' or '..', at most 96 characters).
_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_QUANT = re.compile(r"[A-Za-z0-9_]{1,20}")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")


@dataclass(frozen=True)
class HubName:
    """A repository on the Hugging Face Hub, and what of it is asked for."""

    repo_id: str
    quant: str | None = None  # a GGUF quantisation, as written (matched without case)
    file: str | None = None  # one file's path in the repository
    revision: str | None = None  # None: the default branch

    def __str__(self) -> str:
        text = self.repo_id + (f"/{self.file}" if self.file else "") + (f":{self.quant}" if self.quant else "")
        return text + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class StoreName:
    """A model another tool keeps on this machine: `store` is "ollama" or "lmstudio"."""

    store: str
    name: str


@dataclass(frozen=True)
class ShortName:
    """A name without a source: looked up among the models on this machine."""

    name: str


def parse_hub_name(text: str) -> HubName:
    """`OWNER/REPO[/FILE][:QUANT][@REVISION]` (the `hf:` prefix already taken off); a name
    that is not one is refused in one line."""
    body, revision = text, None
    if "@" in body:
        body, revision = body.split("@", 1)
        if ":" in revision:  # OWNER/REPO@REVISION:QUANT
            revision, quant_after = revision.split(":", 1)
            body = f"{body}:{quant_after}"
        if not _REVISION.fullmatch(revision) or ".." in revision:
            raise UsageError(f"{text!r}: {revision!r} is not a revision (a branch, tag or commit)")
    quant = None
    if ":" in body:
        body, quant = body.split(":", 1)
        if not _QUANT.fullmatch(quant):
            raise UsageError(f"{text!r}: {quant!r} is not a quantisation name (say :Q4_K_M or :q8_0)")
    owner, _, rest = body.partition("/")
    repo, _, file = rest.partition("/")
    for part in (owner, repo):
        if not _PART.fullmatch(part) or "--" in part or ".." in part:
            raise UsageError(f"{text!r} is not a Hugging Face Hub id: name a repository as OWNER/REPO")
    if file and (quant is not None):
        raise UsageError(f"{text!r}: name a file or a quantisation, not both")
    if file:
        check_repo_path(file, text)
    return HubName(f"{owner}/{repo}", quant, file or None, revision)


def check_repo_path(path: str, where: str, error: type[LlamaChatError] = UsageError) -> None:
    """A file's path inside a repository, as a hub listing or a user gives it: refused when
    it could leave the folder it is written into, or carries characters no file name should."""
    parts = path.split("/")
    if (
        not path
        or len(path) > 1000
        or path.startswith("/")
        or "\\" in path
        or any(part in ("", ".", "..") for part in parts)
        or not path.isprintable()  # control, format and bidirectional characters
        or re.match(r"[A-Za-z]:", path)
    ):
        raise error(f"{where}: refused the file name {path!r} (it could point outside the repository)")


def parse_name(text: str) -> HubName | StoreName | ShortName:
    """What a model's name (not a path that exists: resolve.py looks first) asks for."""
    name = text.strip()
    if not name:
        raise UsageError("the model's name is empty: give a path, OWNER/REPO, or a name `llama-chat models` lists")
    if name.startswith(HUB_PREFIX):
        return parse_hub_name(name[len(HUB_PREFIX):])
    for prefix in (OLLAMA_PREFIX, LMSTUDIO_PREFIX):
        if name.startswith(prefix):
            rest = name[len(prefix):]
            if not rest:
                raise UsageError(f"{name!r}: name the model after {prefix!r} (`llama-chat models` lists them)")
            return StoreName(prefix[:-1], rest)
    if "/" in name and not name.startswith(("/", ".", "~")):
        return parse_hub_name(name)
    return ShortName(name)
