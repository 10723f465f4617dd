"""ollama's model store, read where it lies: a model pulled with ollama runs from its blob,
and no byte of it is copied.

The store (`$OLLAMA_MODELS`, else ~/.ollama/models; /usr/share/ollama/.ollama/models for
Linux's system service) holds manifests/HOST/NAMESPACE/MODEL/TAG, one JSON manifest per
model naming its layers by media type and sha256 digest, and blobs/sha256-HEX, one file per
layer. The model layer is the GGUF file itself; beside it a params layer (JSON options),
a system layer (the default system prompt), a template layer (a Go template, never run
here) and perhaps a vision projector or a LoRA adapter.

Everything in the store is read as a stranger's file: names checked by ollama's own rules,
manifests and small layers read up to a size, digests of one shape only, blobs only inside
the store's blobs folder and only after they start with GGUF's magic, walks bounded in
depth and count.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_chat.checkpoints.gguf_file import MAGIC, read_gguf_header
from llama_chat.checkpoints.sampling_defaults import valid_settings
from llama_chat.errors import LlamaChatError, first_line
from llama_chat.models.source import ModelSource
from llama_chat.untrusted_files import open_regular_file, parse_json, read_text_file, shown

PREFIX = "ollama:"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")  # the Linux install script's `ollama` user's home

MODEL = "application/vnd.ollama.image.model"
PARAMS = "application/vnd.ollama.image.params"
SYSTEM = "application/vnd.ollama.image.system"
TEMPLATES = ("application/vnd.ollama.image.template", "application/vnd.ollama.image.prompt")  # prompt: older name
PROJECTOR = "application/vnd.ollama.image.projector"
ADAPTER = "application/vnd.ollama.image.adapter"
MESSAGES = "application/vnd.ollama.image.messages"

# Bounds far above any real store (a manifest is a few kB, params and system a few hundred
# bytes), so that a hostile one is refused or cut short before it costs time or memory.
MAX_MANIFESTS = 10_000  # manifests read by one listing
MAX_ENTRIES = 100_000  # folder entries looked at by one walk
MAX_MANIFEST_BYTES = 1 << 20
MAX_PARAMS_BYTES = 1 << 16
MAX_SYSTEM_BYTES = 1 << 18
MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 256
MAX_NAME_CHARS = 600  # a host of 350 characters, three parts of 80 and their separators

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# ollama's rules for the parts of a name (types/model/name.go): ASCII letters, digits and
# underscore first, then these; ':' only in a host (a port), '.' nowhere in a namespace.
PART_RULES = {
    "host": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}"),
    "namespace": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}"),
    "model": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
    "tag": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
}
_ALLOWED = {
    "host": "letters, digits, '_', '-', '.' and ':', at most 350",
    "namespace": "letters, digits, '_' and '-', at most 80",
    "model": "letters, digits, '_', '-' and '.', at most 80",
    "tag": "letters, digits, '_', '-' and '.', at most 80",
}
# ollama's option names for the sampling settings llama-chat has (api/types.go's Options).
OPTIONS = {
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n", "num_predict": "max_tokens",
}
_NAMES_LOOK_LIKE = "names look like llama3.2, llama3.2:3b, user/model:tag or host/namespace/model:tag"


@dataclass(frozen=True)
class StoreModel:
    """A model another tool keeps on this machine, as a catalog lists it: the name that
    resolves to it, the GGUF file (a split model's first part), its size in bytes (all parts),
    the folder it is listed from, and lines worth knowing before it is chosen."""

    name: str
    path: Path
    size: int
    where: Path
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class OllamaName:
    """A model's name in ollama's four parts, each checked by ollama's rules."""

    host: str
    namespace: str
    model: str
    tag: str

    @property
    def parts(self) -> tuple[str, str, str, str]:
        """The folders of its manifest under manifests/."""
        return self.host, self.namespace, self.model, self.tag

    @property
    def display(self) -> str:
        """The name as `ollama list` shows it: the default registry and namespace left out,
        the tag always there."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"


def parse_ollama_name(text: str) -> OllamaName:
    """`model`, `model:tag`, `namespace/model[:tag]` or `host/namespace/model[:tag]` with
    ollama's defaults filled in; LlamaChatError in one line for anything else, before the
    name comes near a path."""

    def refuse(reason: str) -> LlamaChatError:
        return LlamaChatError(f"{shown(text, 60)} is not an ollama model name ({reason}); {_NAMES_LOOK_LIKE}")

    if len(text) > MAX_NAME_CHARS:
        raise refuse("too long")
    if any(character < " " or character == "\x7f" for character in text):
        raise refuse("it holds a control character")
    if text.startswith(("/", "\\", "~")):
        raise refuse("it is a path; give a file's path without the ollama: prefix")
    if ".." in text:
        raise refuse("it holds '..'")
    rest, tag = text, DEFAULT_TAG
    if text.rfind(":") > text.rfind("/"):
        rest, tag = text.rsplit(":", 1)
    pieces = rest.split("/")
    if len(pieces) > 3:
        raise refuse("more parts than host/namespace/model")
    host, namespace, model = [DEFAULT_HOST, DEFAULT_NAMESPACE][: 3 - len(pieces)] + pieces
    name = OllamaName(host, namespace, model, tag)
    for kind, value in zip(PART_RULES, name.parts):
        if not value:
            raise refuse(f"its {kind} is empty")
        if not PART_RULES[kind].fullmatch(value):
            raise refuse(f"its {kind} {shown(value, 40)} is not one ollama takes: {_ALLOWED[kind]} characters, "
                         "starting with a letter, digit or '_'")
    return name


def store_roots(
    environ: Mapping[str, str] | None = None, home: Path | None = None, service: Path = SERVICE_STORE
) -> list[Path]:
    """The ollama stores on this machine: `$OLLAMA_MODELS` (as ollama reads it: spaces and
    quotes around it dropped) when set, else the user's ~/.ollama/models and the system
    service's folder; only those that exist."""
    environ = os.environ if environ is None else environ
    named = environ.get("OLLAMA_MODELS", "").strip().strip("\"'")
    if named:
        return existing_folders([Path(named)])
    return existing_folders([(home or Path.home()) / ".ollama" / "models", service])


def list_ollama(roots: Sequence[Path]) -> list[StoreModel]:
    """Every usable model in the stores (a name found in two, from the first), at most
    MAX_MANIFESTS manifests read; a manifest that is broken, names a missing or non-GGUF
    blob, or applies a LoRA adapter is left out (resolving its name says why)."""
    models, seen = [], set()
    manifests = itertools.chain.from_iterable(
        ((root, path, OllamaName(*parts)) for path, parts in walk_store(root / "manifests", 4, _valid_part))
        for root in roots
    )
    for root, manifest, name in itertools.islice(manifests, MAX_MANIFESTS):
        if name.display in seen:
            continue
        seen.add(name.display)  # resolving the name takes the first store's, usable or not
        try:
            found = _inspect(root, manifest, name)
        except LlamaChatError:
            continue
        models.append(StoreModel(PREFIX + name.display, found.blob, found.size, manifest.parent, found.notes))
    return models


def resolve_ollama(name: str, roots: Sequence[Path]) -> ModelSource:
    """The model `name` (with or without the ollama: prefix) names in the first store that
    has it, with what its params, system and template layers say; LlamaChatError in one
    line for a name not found, a broken manifest, a blob missing or not GGUF."""
    parsed = parse_ollama_name(name.removeprefix(PREFIX))
    found_in = first_holding(roots, ("manifests", *parsed.parts))
    if found_in is None:
        looked = ", ".join(str(root) for root in roots) or "no ollama store found on this machine"
        raise LlamaChatError(f"no ollama model {parsed.display} (looked in {looked}); "
                             "`llama-chat models` lists the models found")
    root, manifest = found_in
    found = _inspect(root, manifest, parsed)
    sampling: dict = {}
    stop_strings: tuple[str, ...] = ()
    system = None
    notes = list(found.notes)
    template_note = None
    if PARAMS in found.layers:
        sampling, stop_strings = _params(_blob(root, found.layers[PARAMS], "params", parsed))
    if SYSTEM in found.layers:
        system = _layer_text(_blob(root, found.layers[SYSTEM], "system prompt", parsed), MAX_SYSTEM_BYTES)
        system = system if system.strip() else None
    if any(kind in found.layers for kind in TEMPLATES):
        template_note, note = _template_notes(found.blob)
        notes += [note] if note else []
    if MESSAGES in found.layers:
        notes.append("the conversation ollama's Modelfile starts with (its messages layer) is left out")
    return ModelSource(
        path=found.blob, name=PREFIX + parsed.display, origin="ollama", sampling=sampling,
        sampling_source="ollama params", stop_strings=stop_strings, system=system, notes=tuple(notes),
        template_note=template_note,
    )


def walk_store(top: Path, depth: int, keep: Callable[[int, str], bool]) -> Iterator[tuple[Path, tuple[str, ...]]]:
    """The files exactly `depth` folders below `top` (and their names level by level), in
    name order, looking at most at MAX_ENTRIES entries: a name at level `level` (from 0) is
    followed only where keep(level, name), and a symbolic link only where it stays inside
    `top`. Folders that cannot be read are passed over."""
    looked = 0
    stack: list[tuple[Path, tuple[str, ...]]] = [(top, ())]
    while stack:
        folder, names = stack.pop()
        level = len(names)
        try:
            with os.scandir(folder) as scan:
                entries = []
                for entry in scan:
                    looked += 1
                    if looked > MAX_ENTRIES:
                        return
                    if keep(level, entry.name):
                        entries.append((entry.name, entry.is_symlink()))
        except OSError:
            continue
        kept = [(folder / name, (*names, name)) for name, link in sorted(entries)
                if not link or is_inside(folder / name, top)]
        if level == depth - 1:
            yield from kept
        else:
            stack.extend(reversed([(path, parts) for path, parts in kept if os.path.isdir(path)]))


def first_holding(roots: Sequence[Path], parts: Sequence[str]) -> tuple[Path, Path] | None:
    """The first root holding ROOT/PARTS... (a link counts, to be checked by the caller), and that path."""
    for root in roots:
        target = root.joinpath(*parts)
        if os.path.lexists(target):
            return root, target
    return None


def is_inside(path: Path, folder: Path) -> bool:
    """Whether `path`, its links followed, lies within `folder` (its links followed too)."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a loop of links (RuntimeError before Python 3.13)
        return False


def existing_folders(candidates: Iterable[Path]) -> list[Path]:
    """The folders among `candidates` that exist, each once (two names of one folder count once)."""
    folders, seen = [], set()
    for folder in candidates:
        try:
            if not folder.is_dir() or (real := folder.resolve()) in seen:
                continue
        except (OSError, RuntimeError):
            continue
        seen.add(real)
        folders.append(folder)
    return folders


def gguf_size(path: Path, fix: str) -> int:
    """The size of the regular file `path`, once its first bytes are GGUF's magic (nothing
    else may read a blob before); LlamaChatError saying `fix` otherwise."""
    try:
        with open_regular_file(path) as file:
            magic = file.read(len(MAGIC))
            size = os.fstat(file.fileno()).st_size
    except OSError as error:
        raise LlamaChatError(f"{path}: cannot read it ({error.strerror or error}); {fix}") from None
    if magic != MAGIC:
        raise LlamaChatError(f"{path}: not a GGUF file (it starts {shown(magic, 20)}); {fix}")
    return size


@dataclass(frozen=True)
class _Found:
    """A manifest read and checked: its model blob, that blob's size, the digest of the last
    layer of each media type, and the notes a catalog shows."""

    blob: Path
    size: int
    layers: dict[str, str]
    notes: tuple[str, ...]


def _valid_part(level: int, name: str) -> bool:
    return PART_RULES[("host", "namespace", "model", "tag")[level]].fullmatch(name) is not None


def _inspect(root: Path, manifest: Path, name: OllamaName) -> _Found:
    """The manifest of `name` in the store `root`, checked, and its model blob checked to be GGUF."""
    fix = f"pull it again (ollama pull {name.display})"
    if not is_inside(manifest, root / "manifests"):
        raise LlamaChatError(f"{manifest}: the manifest of {name.display} points outside ollama's store; {fix}")
    layers = _read_manifest(manifest, fix)
    if ADAPTER in layers:
        raise LlamaChatError(f"{name.display} ({manifest}) applies a LoRA adapter, which llama-chat does not; "
                             "use the model it adapts instead")
    if MODEL not in layers:
        raise LlamaChatError(f"{manifest}: {name.display} has no GGUF model layer (llama-chat reads only GGUF models "
                             "from ollama's store)")
    blob = _blob(root, layers[MODEL], "model", name)
    size = gguf_size(blob, fix)
    notes = ("its vision projector is left out: llama-chat reads text only",) if PROJECTOR in layers else ()
    return _Found(blob, size, layers, notes)


def _read_manifest(path: Path, fix: str) -> dict[str, str]:
    """Media type to digest (of the last layer of each type, as ollama takes them) of the
    manifest at `path`; LlamaChatError for one that is not ollama's JSON."""
    try:
        contents = parse_json(read_text_file(path, MAX_MANIFEST_BYTES))
    except FileNotFoundError:
        raise LlamaChatError(f"{path}: the manifest is a link to nothing; {fix}") from None
    except LlamaChatError as error:
        raise LlamaChatError(f"{first_line(error)}; {fix}") from None
    except ValueError as error:
        raise LlamaChatError(f"{path}: the manifest is not JSON ({first_line(error)}); {fix}") from None
    listed = contents.get("layers") if isinstance(contents, dict) else None
    if not isinstance(listed, list):
        raise LlamaChatError(f"{path}: the manifest lists no layers; {fix}")
    layers = {}
    for layer in listed:
        kind, digest = (layer.get("mediaType"), layer.get("digest")) if isinstance(layer, dict) else (None, None)
        if not isinstance(kind, str) or not isinstance(digest, str):
            raise LlamaChatError(f"{path}: a layer of the manifest has no media type or digest; {fix}")
        if not DIGEST.fullmatch(digest):
            raise LlamaChatError(f"{path}: the digest {shown(digest, 30)} is not sha256:<64 hex digits>; {fix}")
        layers[kind] = digest
    return layers


def _blob(root: Path, digest: str, what: str, name: OllamaName) -> Path:
    """The blob file of a layer (its digest checked already), present and inside the store's blobs folder."""
    blobs = root / "blobs"
    path = blobs / digest.replace(":", "-")
    if os.path.lexists(path) and not is_inside(path, blobs):
        raise LlamaChatError(f"{path}: the {what} blob of {name.display} points outside ollama's blobs folder; "
                             f"pull it again (ollama pull {name.display})")
    if not os.path.exists(path):
        raise LlamaChatError(f"{path}: the {what} blob of {name.display} is missing; "
                             f"pull it again (ollama pull {name.display})")
    return path


def _layer_text(path: Path, limit: int) -> str:
    """A small layer's text (params, system prompt), refused when larger than `limit` bytes."""
    try:
        return read_text_file(path, limit)
    except FileNotFoundError:
        raise LlamaChatError(f"{path}: the blob went missing while it was read; pull the model again") from None


def _params(path: Path) -> tuple[dict, tuple[str, ...]]:
    """SamplingSettings values (those valid) and stop strings from a params layer: JSON
    options by ollama's names. The seed is left out: one seed for every reply repeats them."""
    try:
        contents: Any = parse_json(_layer_text(path, MAX_PARAMS_BYTES))
    except ValueError as error:
        raise LlamaChatError(f"{path}: ollama's params are not JSON ({first_line(error)})") from None
    if not isinstance(contents, dict):
        raise LlamaChatError(f"{path}: ollama's params are not a JSON object")
    values = {ours: contents[theirs] for theirs, ours in OPTIONS.items() if theirs in contents}
    stop = contents.get("stop")
    stop = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    kept = (text for text in stop if isinstance(text, str) and 0 < len(text) <= MAX_STOP_CHARS)
    return valid_settings(values), tuple(itertools.islice(dict.fromkeys(kept), MAX_STOP_STRINGS))


def _template_notes(blob: Path) -> tuple[str, str | None]:
    """Where the chat template comes from, for /info, and the line the loader shows where it
    is not the GGUF's own: ollama's Go template is never run, so the GGUF's own template is
    used, or, without one, a built-in format guessed from the tokenizer."""
    metadata, _ = read_gguf_header(blob)
    if metadata.get("tokenizer.chat_template"):
        return "the GGUF's own chat template (ollama's Go template is not used)", None
    return ("a built-in format guessed from the tokenizer (ollama's Go template is not used)",
            "ollama's Go template is not used, and the GGUF has no chat template: a built-in format is guessed "
            "from its tokenizer (--chat-format names one)")
