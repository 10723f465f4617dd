"""The folders llama-chat's file tools may touch: the working folder, where relative paths
start, and the folders the user adds; and a path a tool was given, as a place in one of them.

A path is resolved with its symbolic links followed before it is checked, so that `../x`,
an absolute path elsewhere and a link pointing out are all seen for where they lead. What a
tool then does there goes through descriptors opened beneath the folder at the moment of use
(tools/beneath.py): a name swapped for a link since the check makes the use fail, never
lead out.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llama_chat.errors import LlamaChatError, first_line
from llama_chat.tools.beneath import FOLDER_PATH, kernel_resolves_beneath, open_beneath, open_folder
from llama_chat.tools.checks import Refused

ADDING = "/tools folder"  # how the user adds a folder, for the model to pass on
MISSING, FOLDER, FILE, OTHER = "missing", "folder", "file", "other"  # what a place holds, for Place.kind


class Folders:
    """The working folder and the folders added to it, each resolved once, as it is given.
    `openat2`: whether paths are opened by the kernel's openat2 (None: where it has it) or by
    a walk a name at a time."""

    def __init__(self, working: str | os.PathLike[str], added: Iterable[str | os.PathLike[str]] = (),
                 openat2: bool | None = None) -> None:
        self.working = Path(os.path.realpath(working))
        self.openat2 = kernel_resolves_beneath() if openat2 is None else openat2
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
        path with a NUL character in it is refused (no file can be named so), and so is one
        whose links change while they are followed."""
        if "\0" in given:
            raise Refused(f"{given!r} has a NUL character in it, which no path can hold: give the path without it")
        try:
            return Path(os.path.realpath(os.path.join(self.working, given)))
        except (OSError, RuntimeError, ValueError) as error:  # a link swapped while it was read
            reason = error.strerror if isinstance(error, OSError) and error.strerror else first_line(error)
            raise Refused(f"{given} changed while it was looked at ({reason}): ask again") from None

    def contains(self, path: Path) -> bool:
        """Whether `path` (resolved) is one of the folders or inside one."""
        return any(path.is_relative_to(folder) for folder in self.all)

    def place(self, tool: str, given: str) -> Place:
        """Where `given` leads, refused (one line naming the tool) where it is outside the folders."""
        try:
            resolved = self.resolve(given)
        except Refused as refused:
            raise Refused(f"{tool}: {refused}") from None
        for folder in self.all:
            if resolved.is_relative_to(folder):
                return Place(given, folder, resolved.relative_to(folder).parts, self.openat2)
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


@dataclass(frozen=True)
class Place:
    """Where a path a tool was given led when it was resolved: one of the folders the tools
    may use and the names beneath it. Whatever is done there is done through descriptors
    opened beneath the folder when it is done (`openat2` says how)."""

    given: str
    folder: Path
    names: tuple[str, ...]
    openat2: bool

    @property
    def path(self) -> Path:
        return self.folder.joinpath(*self.names)

    @property
    def name(self) -> str:
        return self.names[-1] if self.names else self.folder.name

    def parent(self) -> Place:
        """The place of the folder this one is in (the folder itself for the folder)."""
        return Place(self.given, self.folder, self.names[:-1], self.openat2)

    def child(self, name: str) -> Place:
        return Place(self.given, self.folder, (*self.names, name), self.openat2)

    def open(self, flags: int) -> int:
        """A descriptor of what is here now, opened with `flags` beneath the folder; OSError
        where it is missing, or where a name on the way is a link now."""
        folder = open_folder(self.folder)
        try:
            return open_beneath(folder, self.names, flags, self.openat2)
        finally:
            os.close(folder)

    def open_folder(self) -> int:
        """A descriptor of the folder here, to open what is in it through (not to list)."""
        return self.open(FOLDER_PATH)

    def kind(self) -> str:
        """What is here now: MISSING, FOLDER, FILE (a regular one) or OTHER (a pipe, socket or
        device). OSError where it cannot be looked at (permission denied, a link now)."""
        if not self.names:
            return FOLDER if os.path.isdir(self.folder) else MISSING
        try:
            folder = self.parent().open_folder()
        except (FileNotFoundError, NotADirectoryError):  # NotADirectoryError: a file on the way to it
            return MISSING
        try:
            mode = os.stat(self.names[-1], dir_fd=folder, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return MISSING
        finally:
            os.close(folder)
        if stat.S_ISLNK(mode):  # it was no link when it was resolved
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(self.path))
        if stat.S_ISDIR(mode):
            return FOLDER
        return FILE if stat.S_ISREG(mode) else OTHER
