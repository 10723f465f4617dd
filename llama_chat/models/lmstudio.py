"""LM Studio's model folders, read where they lie: PUBLISHER/REPO/FILE.gguf, as LM Studio
downloads them from Hugging Face.

The folder is LM Studio's home's models/ (the home is ~/.lmstudio, or the folder named by
~/.lmstudio-home-pointer, which LM Studio's lms tool writes; older versions kept
~/.cache/lm-studio), or the folder chosen in the app, which its settings.json keeps as
downloadsFolder. A vision projector (mmproj*.gguf) sits beside the model it serves and is
not a model; a split model (NAME-00001-of-00003.gguf, ...) is listed once, by its first part.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from llama_chat.checkpoints.gguf_split import named_parts
from llama_chat.errors import LlamaChatError
from llama_chat.models.ollama import StoreModel, existing_folders, first_holding, gguf_size, is_inside, walk_store
from llama_chat.models.source import ModelSource
from llama_chat.untrusted_files import parse_json, read_text_file, shown

PREFIX = "lmstudio:"
MAX_FILES = 10_000  # GGUF files looked at by one listing
MAX_SETTINGS_BYTES = 1 << 20
MAX_POINTER_BYTES = 4096
MAX_PART_CHARS = 255  # a file name's longest on common file systems
MAX_CANDIDATES_SHOWN = 10
_FIRST_PART = re.compile(r".+-00001-of-(\d{5})\.gguf")
_LATER_PART = re.compile(r".+-(?!00001)\d{5}-of-\d{5}\.gguf")
_NAMES_LOOK_LIKE = "names look like lmstudio:PUBLISHER/REPO or lmstudio:PUBLISHER/REPO/FILE.gguf"
_FIX = "download it again in LM Studio"


def store_roots(home: Path | None = None) -> list[Path]:
    """LM Studio's model folders on this machine that exist: the one its settings name,
    its home's models/, and the default places of current and older versions."""
    home = home or Path.home()
    lmstudio_home = _pointed_home(home) or home / ".lmstudio"
    chosen = _settings_folder(lmstudio_home)
    candidates = [*([chosen] if chosen else []), lmstudio_home / "models", home / ".lmstudio" / "models",
                  home / ".cache" / "lm-studio" / "models"]
    return existing_folders(candidates)


def list_lmstudio(roots: Sequence[Path]) -> list[StoreModel]:
    """Every GGUF model in the folders (a name found in two, from the first), at most
    MAX_FILES files looked at; a file that is not GGUF, or a split model with a part
    missing, is left out, and so are vision projectors and later parts of split models."""
    models, seen = [], set()
    files = itertools.chain.from_iterable(
        ((root, path, parts) for path, parts in walk_store(root, 3, _wanted)) for root in roots
    )
    by_folder = itertools.groupby(itertools.islice(files, MAX_FILES), key=lambda found: found[1].parent)
    for folder, group in by_folder:
        found = list(group)
        notes = _projector_notes(path.name for _, path, _ in found)
        for root, path, parts in found:
            name = PREFIX + "/".join(parts)
            if _is_projector(path.name) or _LATER_PART.fullmatch(path.name) or name in seen:
                continue
            seen.add(name)
            try:
                size = _model_size(path, root)
            except LlamaChatError:
                continue
            models.append(StoreModel(name, path, size, folder, notes))
    return models


def resolve_lmstudio(name: str, roots: Sequence[Path]) -> ModelSource:
    """The GGUF file `name` (with or without the lmstudio: prefix) names in the first folder
    that has it: PUBLISHER/REPO/FILE.gguf, or PUBLISHER/REPO when that folder holds one
    model; LlamaChatError in one line otherwise."""
    pieces = _parse(name.removeprefix(PREFIX))
    found_in = first_holding(roots, pieces)
    if found_in is None:
        looked = ", ".join(str(root) for root in roots) or "no LM Studio models folder found on this machine"
        raise LlamaChatError(f"no LM Studio model {PREFIX}{'/'.join(pieces)} (looked in {looked}); "
                             "`llama-chat models` lists the models found")
    root, target = found_in
    if not is_inside(target, root):
        raise LlamaChatError(f"{target}: points outside LM Studio's models folder {root}; llama-chat reads only "
                             "what lies inside it")
    folder = target if len(pieces) == 2 else target.parent
    in_folder = [path for path, _ in walk_store(folder, 1, lambda _, file: _wanted(2, file))]
    path = target if len(pieces) == 3 else _only_model(folder, in_folder, "/".join(pieces))
    if _is_projector(path.name):
        raise LlamaChatError(f"{path}: a vision projector, not a model; name the model file beside it")
    if _LATER_PART.fullmatch(path.name):
        raise LlamaChatError(f"{path}: a later part of a split model; name its first part (...-00001-of-...gguf)")
    _model_size(path, root)
    return ModelSource(
        path=path, name=PREFIX + "/".join((*pieces[:2], path.name)), origin="lmstudio",
        notes=_projector_notes(found.name for found in in_folder),
    )


def _parse(text: str) -> list[str]:
    """PUBLISHER/REPO[/FILE.gguf] as its parts, each a plain name (no '..', no separators,
    no control characters); LlamaChatError in one line otherwise."""

    def refuse(reason: str) -> LlamaChatError:
        return LlamaChatError(f"{shown(text, 60)} is not an LM Studio model name ({reason}); {_NAMES_LOOK_LIKE}")

    if any(character < " " or character == "\x7f" for character in text):
        raise refuse("it holds a control character")
    if text.startswith(("/", "~")) or "\\" in text:
        raise refuse("it is a path; give a file's path without the lmstudio: prefix")
    pieces = text.split("/")
    for piece in pieces:
        if piece in ("", ".", ".."):
            raise refuse(f"it has a part {shown(piece)}")
        if len(piece) > MAX_PART_CHARS:
            raise refuse("a part is too long")
    if len(pieces) not in (2, 3):
        raise refuse("expected PUBLISHER/REPO or PUBLISHER/REPO/FILE.gguf")
    if len(pieces) == 3 and not pieces[2].lower().endswith(".gguf"):
        raise refuse("the file is not a .gguf file")
    return pieces


def _only_model(folder: Path, files: list[Path], name: str) -> Path:
    """The one model file in `folder`, or LlamaChatError naming the candidates."""
    candidates = [path for path in files if not _is_projector(path.name) and not _LATER_PART.fullmatch(path.name)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise LlamaChatError(f"{folder}: no GGUF model in {PREFIX}{name}")
    shown_names = ", ".join(f"{PREFIX}{name}/{path.name}" for path in candidates[:MAX_CANDIDATES_SHOWN])
    more = f" and {len(candidates) - MAX_CANDIDATES_SHOWN} more" if len(candidates) > MAX_CANDIDATES_SHOWN else ""
    raise LlamaChatError(f"{PREFIX}{name} holds {len(candidates)} GGUF models; name one: {shown_names}{more}")


def _model_size(path: Path, root: Path) -> int:
    """The bytes of the model `path` names (all parts of a split one), each checked to lie
    inside `root` and the first to be GGUF; LlamaChatError otherwise."""
    size = gguf_size(path, _FIX)
    parts = named_parts(path)
    split = _FIRST_PART.fullmatch(path.name)
    if split and len(parts) < int(split[1]):
        raise LlamaChatError(f"{path}: part {len(parts) + 1} of {int(split[1])} of the split model is missing; {_FIX}")
    for part in parts[1:]:
        if not is_inside(part, root):
            raise LlamaChatError(f"{part}: points outside LM Studio's models folder {root}")
        try:
            size += part.stat().st_size
        except OSError as error:
            raise LlamaChatError(f"{part}: cannot read it ({error.strerror or error})") from None
    return size


def _wanted(level: int, name: str) -> bool:
    """Folders and .gguf files, no hidden ones (LM Studio's own are)."""
    return not name.startswith(".") and (level < 2 or name.lower().endswith(".gguf"))


def _is_projector(name: str) -> bool:
    return name.lower().startswith("mmproj")


def _projector_notes(names: Iterable[str]) -> tuple[str, ...]:
    projectors = [name for name in names if _is_projector(name)]
    return (f"its vision projector ({projectors[0]}) is left out: llama-chat reads text only",) if projectors else ()


def _pointed_home(home: Path) -> Path | None:
    """The home folder ~/.lmstudio-home-pointer names (an absolute path on one line), if any."""
    try:
        text = read_text_file(home / ".lmstudio-home-pointer", MAX_POINTER_BYTES).strip()
    except (FileNotFoundError, LlamaChatError):
        return None
    return Path(text) if text and "\n" not in text and "\0" not in text and os.path.isabs(text) else None


def _settings_folder(lmstudio_home: Path) -> Path | None:
    """The models folder chosen in LM Studio (settings.json's downloadsFolder), if any."""
    try:
        settings = parse_json(read_text_file(lmstudio_home / "settings.json", MAX_SETTINGS_BYTES))
    except (FileNotFoundError, ValueError, LlamaChatError):  # a settings file that cannot be read sets nothing
        return None
    folder = settings.get("downloadsFolder") if isinstance(settings, dict) else None
    return Path(folder) if isinstance(folder, str) and "\0" not in folder and os.path.isabs(folder) else None
