"""Writing a directory whole or not at all: it is built beside its final place, then renamed in.

A reader never sees half a checkpoint: a failed write leaves nothing behind, and replacing
an existing directory keeps the old one (as .NAME.previous) until the new one is in place.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_directory(target: Path, *, replace: bool = False) -> Iterator[Path]:
    """An empty folder beside `target` to write into; moved to `target` when the block ends
    without an error (an existing `target` only with `replace`), removed when it fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.writing"
    shutil.rmtree(staging, ignore_errors=True)  # left over from a crash
    staging.mkdir()
    try:
        yield staging
        if replace:
            replace_directory(staging, target)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def replace_directory(new: Path, target: Path) -> None:
    """Put `new` in the place of `target`, keeping the old one until the new one is in place.

    A crash between the two renames leaves the complete old directory at .NAME.previous,
    which recover_directory puts back.
    """
    previous = _previous(target)
    shutil.rmtree(previous, ignore_errors=True)
    if target.exists():
        target.rename(previous)
    new.rename(target)
    shutil.rmtree(previous, ignore_errors=True)


def recover_directory(target: Path) -> None:
    """Undo a crash between replace_directory's renames."""
    previous = _previous(target)
    if not target.exists() and previous.is_dir():
        previous.rename(target)


def _previous(target: Path) -> Path:
    return target.parent / f".{target.name}.previous"
