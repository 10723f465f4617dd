"""A model's name (names.py) resolved to the local files the readers open: a path that
exists always wins; a Hub id is fetched into the Hugging Face cache unless it is there;
ollama's and LM Studio's models are read where they lie; a short name is looked up among
the models on this machine, and one that names several lists them in one line."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from llama_chat.errors import LlamaChatError
from llama_chat.models import hub, lmstudio, ollama
from llama_chat.models.names import HubName, ShortName, StoreName, parse_name
from llama_chat.models.source import ModelSource
from llama_chat.paths import expanded, weights_dir


def note_on_stderr(line: str) -> None:
    print(f"llama-chat: {line}", file=sys.stderr)


def resolve(
    name: str | Path | ModelSource,
    environ: Mapping[str, str] = os.environ,
    notify: Callable[[str], None] = note_on_stderr,
) -> ModelSource:
    """The local model `name` stands for, fetched from the Hub if need be (see names.py for
    the forms a name takes); LlamaChatError, in one line, where there is none."""
    if isinstance(name, ModelSource):
        return name
    path = expanded(name)
    if path.exists():
        return ModelSource(path=path, name=path.name)
    if str(name).startswith(("/", "./", "../", "~")) or isinstance(name, Path):
        raise LlamaChatError(f"{path}: no such file or directory")
    parsed = parse_name(str(name))
    if isinstance(parsed, HubName):
        return hub.fetch(parsed, hub.HubSettings.from_environment(environ), notify)
    if isinstance(parsed, StoreName):
        if parsed.store == "ollama":
            return ollama.resolve_ollama(parsed.name, ollama.store_roots(environ))
        return lmstudio.resolve_lmstudio(parsed.name, lmstudio.store_roots())
    return _short_name(parsed, environ)


def _short_name(name: ShortName, environ: Mapping[str, str]) -> ModelSource:
    """A name without a source: a file in llama-chat's weights folder, a model `llama-chat
    download` knows, or one ollama keeps; several of them in one line."""
    from llama_chat.default_model import KNOWN_MODELS, download_model

    found: dict[str, Callable[[], ModelSource]] = {}
    folder = weights_dir()
    for candidate in (folder / name.name, folder / f"{name.name}.gguf"):
        if candidate.is_file() and "/" not in name.name:
            found[str(candidate)] = lambda candidate=candidate: ModelSource(path=candidate, name=candidate.name,
                                                                            origin="weights")
            break
    if name.name in KNOWN_MODELS and not found:
        found[f"{name.name} (llama-chat download)"] = lambda: _known(name.name, download_model)
    roots = ollama.store_roots(environ)
    for model in ollama.list_ollama(roots):
        if model.name in (f"ollama:{name.name}", f"ollama:{name.name}:latest"):
            found[model.name] = lambda model=model: ollama.resolve_ollama(model.name.removeprefix("ollama:"), roots)
    if len(found) == 1:
        return next(iter(found.values()))()
    if found:
        raise LlamaChatError(f"{name.name!r} names {len(found)} models: {', '.join(found)}; give one of these names")
    raise LlamaChatError(f"{name.name}: no such file or directory, nor a model of that name on this machine "
                         "(`llama-chat models` lists them); a model on the Hugging Face Hub is named OWNER/REPO")


def _known(name: str, download: Callable[[str], Path]) -> ModelSource:
    path = download(name)
    return ModelSource(path=path, name=path.name, origin="weights")
