"""The folders llama-chat's file tools may touch: the working folder, where relative paths
start, and the folders the user adds.

A path is resolved with its symbolic links followed before it is checked, so that `../x`,
an absolute path elsewhere and a link pointing out are all seen for where they lead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from llama_chat.errors import LlamaChatError
from llama_chat.tools.checks import Refused

ADDING = "/tools folder"  # how the user adds a folder, for the model to pass on


class Folders:
    """The working folder and the folders added to it, each resolved once, as it is given."""

    def __init__(self, working: str | os.PathLike[str], added: Iterable[str | os.PathLike[str]] = ()) -> None:
        self.working = Path(os.path.realpath(working))
        self.added: list[Path] = []
        for folder in added:
            self.add(folder)

    @property
    def all(self) -> tuple[Path, ...]:
        return (self.working, *self.added)

    def add(self, folder: str | os.PathLike[str]) -> Path:
        """Let the tools use `folder` too (`~` is the home folder; a relative one starts at the
        working folder); the folder as resolved. LlamaChatError where it is no folder."""
        resolved = self.resolve(os.path.expanduser(os.fspath(folder)))
        if not resolved.is_dir():
            raise LlamaChatError(f"{os.fspath(folder)} is not a folder: give one that exists to let the tools use it")
        if not any(resolved == known for known in self.all):
            self.added.append(resolved)
        return resolved

    def resolve(self, given: str) -> Path:
        """Where `given` leads: relative to the working folder, with every link followed. A
        path with a NUL character in it is refused (no file can be named so)."""
        if "\0" in given:
            raise Refused(f"{given!r} has a NUL character in it, which no path can hold: give the path without it")
        return Path(os.path.realpath(os.path.join(self.working, given)))

    def contains(self, path: Path) -> bool:
        """Whether `path` (resolved) is one of the folders or inside one."""
        return any(path.is_relative_to(folder) for folder in self.all)

    def inside(self, tool: str, given: str) -> Path:
        """`given` resolved, refused (one line naming the tool) where it leads outside the folders."""
        try:
            resolved = self.resolve(given)
        except Refused as refused:
            raise Refused(f"{tool}: {refused}") from None
        if self.contains(resolved):
            return resolved
        written = Path(os.path.normpath(os.path.join(self.working, given)))
        leads = "" if written == resolved else f" (it leads to {resolved})"
        folders = ", ".join(str(folder) for folder in self.all)
        raise Refused(f"{tool}: {given}{leads} is outside the folders the tools may use ({folders}, and folders "
                      f"the user adds with {ADDING}): ask for a path inside them")

    def shown(self, path: Path) -> str:
        """`path` as the model should write it again: relative where it is in the working
        folder, whole where it is elsewhere."""
        if path.is_relative_to(self.working):
            return str(path.relative_to(self.working)) if path != self.working else "."
        return str(path)
