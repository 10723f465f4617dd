"""Every model on this machine that llama-chat can run (`llama-chat models`, /models): the
Hugging Face cache, ollama's store, LM Studio's folders and llama-chat's weights folder,
each read in place. A row gives the name to load it by, what it is, and where it lies.

What is read of each model is its header (a GGUF file's metadata and tensor table, a
checkpoint folder's config and tensor headers), never its weights; a model that cannot be
read, or is of an architecture llama-chat does not run, is left out and counted.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from llama_chat.errors import LlamaChatError
from llama_chat.models import hub, lmstudio, ollama
from llama_chat.models.hub_files import SPLIT_PART, quant_of
from llama_chat.paths import weights_dir

MOST_REPOS = 2_000  # folders of the Hugging Face cache looked into


@dataclass(frozen=True)
class Row:
    """One model: the name that loads it, and what `llama-chat models` shows of it."""

    name: str
    source: str  # "hf", "ollama", "lmstudio", "weights"
    architecture: str
    parameters: int
    quantisation: str
    size: int  # bytes on disk, every part counted
    path: str
    template: str  # where its chat template comes from

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Catalog:
    rows: list[Row]
    left_out: list[str]  # "PATH: why", for models that could not be listed


def catalog(environ: Mapping[str, str] = os.environ) -> Catalog:
    """Every model llama-chat can run on this machine, each source in turn."""
    rows: list[Row] = []
    left_out: list[str] = []
    for name, path, source, template in _candidates(environ):
        try:
            rows.append(describe(name, path, source, template))
        except (LlamaChatError, OSError, ValueError) as error:
            left_out.append(f"{name}: {str(error).splitlines()[0] if str(error) else type(error).__name__}")
    return Catalog(rows, left_out)


def model_names(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The names `catalog` would list, without reading any model's header (for completion)."""
    return [name for name, *_ in _candidates(environ)]


def _candidates(environ: Mapping[str, str]) -> Iterator[tuple[str, Path, str, str | None]]:
    """(name, path, source, template note) of every model each source holds."""
    yield from _hub_cache(hub.HubSettings.from_environment(environ))
    for model in ollama.list_ollama(ollama.store_roots(environ)):
        yield model.name, model.path, "ollama", "its own (in the GGUF; ollama's Go template is not used)"
    for model in lmstudio.list_lmstudio(lmstudio.store_roots()):
        yield model.name, model.path, "lmstudio", None
    folder = weights_dir()
    if folder.is_dir():
        for path in sorted(folder.glob("*.gguf"))[:MOST_REPOS]:
            if _first_part(path.name):
                yield path.name, path, "weights", None


def _first_part(file_name: str) -> bool:
    """Not a later part of a split GGUF file, nor a vision projector."""
    part = SPLIT_PART.search(file_name)
    return (part is None or int(part.group(1)) == 1) and not file_name.lower().startswith("mmproj")


def _hub_cache(settings: hub.HubSettings) -> Iterator[tuple[str, Path, str, str | None]]:
    """The Hugging Face cache's models: each GGUF file (by OWNER/REPO:QUANT where its quantisation
    is the repository's only file of it, else OWNER/REPO/FILE), and each checkpoint folder."""
    try:
        folders = sorted(settings.cache_dir.glob("models--*--*"))[:MOST_REPOS]
    except OSError:
        return
    for folder in folders:
        repo_id = folder.name.removeprefix("models--").replace("--", "/", 1)
        if repo_id.count("/") != 1:
            continue
        snapshot = _newest_snapshot(folder)
        if snapshot is None:
            continue
        files = hub.snapshot_files(snapshot)
        ggufs = [f for f in files if f.path.lower().endswith(".gguf") and _first_part(f.path.rsplit("/", 1)[-1])]
        quants = [quant_of(f.path) for f in ggufs]
        for file, quant in zip(ggufs, quants):
            unique = quant is not None and quants.count(quant) == 1
            yield (f"{repo_id}:{quant}" if unique else f"{repo_id}/{file.path}"), snapshot / file.path, "hf", None
        if not ggufs and any(f.path == "config.json" for f in files) and any(
                f.path.endswith(".safetensors") and "/" not in f.path for f in files):
            yield repo_id, snapshot, "hf", None


def _newest_snapshot(folder: Path) -> Path | None:
    """The snapshot the default branch points to, else the one changed last."""
    ref = hub.branch_commit(folder, hub.DEFAULT_BRANCH)
    if ref is not None and (folder / "snapshots" / ref).is_dir():
        return folder / "snapshots" / ref
    try:
        snapshots = [path for path in (folder / "snapshots").iterdir() if path.is_dir()]
    except OSError:
        return None
    return max(snapshots, key=lambda path: path.stat().st_mtime, default=None)


def describe(name: str, path: Path, source: str, template: str | None = None) -> Row:
    """A model's row, from its header; LlamaChatError for one llama-chat cannot run."""
    if path.is_dir():
        return _describe_folder(name, path, source)
    from llama_chat.checkpoints.gguf import ARCHITECTURES
    from llama_chat.checkpoints.gguf_split import read_gguf_model

    metadata, tensors, files = read_gguf_model(path)
    architecture = str(metadata.get("general.architecture", "?"))
    if architecture not in ARCHITECTURES:
        raise LlamaChatError(f"a {architecture[:40]} model, which llama-chat does not run")
    parameters = sum(math.prod(info.shape) for info in tensors.values())
    has_template = isinstance(metadata.get("tokenizer.chat_template"), str)
    builtin = f"built-in ({architecture})"
    return Row(name, source, architecture, parameters, _quantisation(metadata, tensors, path),
               sum(file.stat().st_size for file in files), str(path),
               (template or "its own (in the GGUF file)") if has_template else builtin)


def _quantisation(metadata: Mapping, tensors: Mapping, path: Path) -> str:
    """The file's quantisation: what its file type says (Q4_K_M), else its name, else the
    type holding most of its bytes."""
    import gguf

    file_type = metadata.get("general.file_type")
    if isinstance(file_type, int):
        try:
            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    named = quant_of(path.name)
    if named:
        return named
    by_type: dict[str, int] = {}
    for info in tensors.values():
        by_type[info.tensor_type.name] = by_type.get(info.tensor_type.name, 0) + info.n_bytes
    return max(by_type, key=by_type.__getitem__, default="?")


def _describe_folder(name: str, path: Path, source: str) -> Row:
    from llama_chat.checkpoints.detect import read_checkpoint

    checkpoint = read_checkpoint(path)
    unique = {id(tensor): tensor for tensor in checkpoint.tensors.values()}
    parameters = sum(math.prod(tensor.shape) for tensor in unique.values())
    size = sum(file.stat().st_size for file in path.iterdir() if file.is_file())
    dtypes = {re.sub(r"^torch\.", "", str(getattr(tensor, "dtype", "?"))) for tensor in unique.values()}
    template = "its own (tokenizer_config.json)" if checkpoint.chat_template else "built-in"
    return Row(name, source, checkpoint.args.architecture, parameters, "/".join(sorted(dtypes)), size, str(path),
               template)
