"""Split GGUF models, as llama.cpp's gguf-split writes them: NAME-00001-of-00003.gguf,
NAME-00002-of-00003.gguf, ..., each a whole GGUF file (header, tensor table, data).

The first part holds the model's metadata; every part says which it is (split.no, from 0),
how many there are (split.count) and how many tensors they hold together
(split.tensors.count). A person names the first part; the others are found beside it by
the name llama.cpp gives them (llama_split_path), and each is checked to be the part its
name says before any tensor is used, so that a missing, stray or repeated part is one line
rather than a model with weights of another. Tensors stay where they lie: each TensorInfo
names its own part's file, read from there as a single file's are.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from llama_chat.checkpoints.gguf_file import MAGIC, MAX_TENSORS, TensorInfo, read_gguf_header
from llama_chat.errors import LlamaChatError
from llama_chat.untrusted_files import open_regular_file, shown

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
MAX_PARTS = (1 << 16) - 1  # split.no and split.count are u16
_FIRST_PART = re.compile(r"(.+)-00001-of-(\d{5})\.gguf")
_AGAIN = "the parts are not of one split model; download them again"


def part_name(prefix: str, number: int, count: int) -> str:
    """llama.cpp's name for part `number` (from 1) of `count`: PREFIX-00002-of-00003.gguf."""
    return f"{prefix}-{number:05d}-of-{count:05d}.gguf"


def _prefix(name: str, number: int, count: int) -> str | None:
    """The PREFIX of `name` when it is named as part `number` of `count`, else None."""
    suffix = part_name("", number, count)
    return name[: -len(suffix)] if name.endswith(suffix) and len(name) > len(suffix) else None


def named_parts(path: Path) -> list[Path]:
    """`path`, and when it is named as a split model's first part, the later parts beside it
    up to the first one missing: the files a model named by `path` is read from, found by
    their names alone (a packed cache's key covers them all without reading a header)."""
    match = _FIRST_PART.fullmatch(path.name)
    if match is None:
        return [path]
    parts = [path]
    count = int(match[2])
    for number in range(2, count + 1):
        part = path.with_name(part_name(match[1], number, count))
        if not part.is_file():
            break
        parts.append(part)
    return parts


def read_gguf_model(
    path: Path, step_over: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], dict[str, TensorInfo], list[Path]]:
    """The metadata of the GGUF model `path` names (a split model's is its first part's; its
    arrays under the keys `step_over` names left out), the tensors of all its parts, and the
    files they lie in (`path` alone for one not split).
    LlamaChatError, in one line naming the file, for a part missing, not a GGUF, or not the
    part its name says, and for a later part named instead of the first."""
    metadata, tensors = _read_part(path, step_over)
    count = _split_number(metadata, SPLIT_COUNT, path, 1, MAX_PARTS, default=1)
    number = _split_number(metadata, SPLIT_NO, path, 0, count - 1, default=0 if count == 1 else None)
    if number != 0:
        prefix = _prefix(path.name, number + 1, count)
        first = part_name(prefix, 1, count) if prefix is not None else f"the one named ...-00001-of-{count:05d}.gguf"
        raise LlamaChatError(f"{path} is part {number + 1} of {count} of a split model; name its first part, {first}")
    if count == 1:
        return metadata, tensors, [path]
    prefix = _prefix(path.name, 1, count)
    if prefix is None:
        raise LlamaChatError(
            f"{path} is the first of {count} parts of a split model, but its name does not end "
            f"-00001-of-{count:05d}.gguf, so the others cannot be found; give the parts the names gguf-split gave them"
        )
    total = _split_number(metadata, SPLIT_TENSORS, path, 0, MAX_TENSORS * count)
    parts, files = [path], {_file_id(path): path}
    for number in range(2, count + 1):
        part = path.with_name(part_name(prefix, number, count))
        tensors |= _later_part(path, part, number, count, files, tensors)
        parts.append(part)
    if len(tensors) != total:
        raise LlamaChatError(f"{path}: its {count} parts hold {len(tensors)} tensors, where {SPLIT_TENSORS} says "
                             f"{total}; {_AGAIN}")
    return metadata, tensors, parts


def _later_part(
    path: Path, part: Path, number: int, count: int, files: dict[Any, Path], tensors: dict[str, TensorInfo]
) -> dict[str, TensorInfo]:
    """Part `number` of the split model whose first part is `path`: its tensors, once it is
    known to be a file of its own that says it is that part and repeats no tensor."""
    if not os.path.lexists(part):
        raise LlamaChatError(
            f"{path}: part {number} of {count}, {part.name}, is missing; "
            "all parts of a split model must sit together in one folder"
        )
    if (earlier := files.setdefault(_file_id(part), part)) != part:
        raise LlamaChatError(f"{part} is the same file as {earlier.name}; each part of a split model is a file "
                             "of its own (download the parts again)")
    part_metadata, part_tensors = _read_part(part)
    said_count = _split_number(part_metadata, SPLIT_COUNT, part, 1, MAX_PARTS)
    if said_count != count:
        raise LlamaChatError(f"{part} says the model is split in {said_count} parts, where {path.name} says "
                             f"{count}; {_AGAIN}")
    said_number = _split_number(part_metadata, SPLIT_NO, part, 0, MAX_PARTS - 1)
    if said_number != number - 1:
        raise LlamaChatError(f"{part} says it is part {said_number + 1}, where its name says part {number}; "
                             f"{_AGAIN}")
    if (repeated := next((name for name in part_tensors if name in tensors), None)) is not None:
        raise LlamaChatError(f"{part}: tensor {repeated} is in {tensors[repeated].file.name} too; {_AGAIN}")
    return part_tensors


def _read_part(
    path: Path, step_over: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """One GGUF file's header (see read_gguf_header); a file that is not a GGUF is refused by name."""
    try:
        with open_regular_file(path) as file:
            magic = file.read(len(MAGIC))
    except OSError as error:
        raise LlamaChatError(f"{path}: cannot read it ({error.strerror or error})") from None
    if magic != MAGIC:
        raise LlamaChatError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    return read_gguf_header(path, step_over)


def _file_id(path: Path) -> tuple[int, int]:
    """What tells two names of one file (a link, a symbolic link) apart from two files."""
    try:
        info = path.stat()
    except OSError as error:
        raise LlamaChatError(f"{path}: cannot read it ({error.strerror or error})") from None
    return info.st_dev, info.st_ino


def _split_number(
    metadata: dict[str, Any], key: str, source: Path, low: int, high: int, default: int | None = None
) -> int:
    """A split.* value: a whole number from `low` to `high`; `default` where the key is absent
    (None: the key must be there)."""
    value = metadata.get(key, default)
    if type(value) is not int or not low <= value <= high:
        what = "no value" if value is None else shown(value)
        raise LlamaChatError(f"{source}: {key} is {what}, where a whole number from {low} to {high} belongs; "
                             "the file is damaged, download it again")
    return value
