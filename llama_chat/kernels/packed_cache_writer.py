"""A first load's new packed-cache entries, written behind the chat.

A first load packs into private memory (packed_cache.EntryImage: the entry's bytes laid out
as its file) and the model answers at once; the entry is written from that memory by a
thread of the chat's, at the lowest priority, so that the next start maps it. Writing
4.5 GB goes at the disk's pace once it passes the kernel's dirty-page limit (5-10 s here);
on the load's own path it made a first load 2.9x llama.cpp's.

What could fail for want of room or rights is done at load, before the thread starts: room
is made within the cache's bound (make_room), and each entry's file is made under a
temporary name with its space reserved, so a full disk or an unwritable cache is the load's
one line as before. The thread then copies the image, renames each entry into place when it
is whole, and maps the written file over the image's pages (the process's own memory falls
by the model's size; the pages are the page cache's, shared with later starts). A thread
cannot outlive the chat: a SIGKILL or SIGHUP mid-write leaves only the temporary file, named
with the process id, which the next write of that entry removes. A process that ends
normally finishes its writes first (the command line says so in a line; Ctrl-C leaves them).
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from llama_chat import disk_cache
from llama_chat.errors import first_line
from llama_chat.kernels.packed_cache import EntryImage, WriteStopped
from llama_chat.kernels.packed_cache_entries import make_room

LOWEST_PRIORITY = 19
NOTICEABLE_SECONDS = 1.0  # a wait at the end said in a line when longer


class EntryWrite(threading.Thread):
    """New entries written from their images in the background: `reserve` at load, then
    `start`. `failure` is one line once a write ended without its entries ("" otherwise)."""

    def __init__(self, images: dict[Path, EntryImage], name: str) -> None:
        super().__init__(name=f"packed cache write: {name}", daemon=True)
        self.images = images
        self.model_name = name
        self.failure = ""
        self._stopping = threading.Event()
        self._staged: dict[Path, tuple[AbstractContextManager[Path], Path]] = {}

    @classmethod
    def reserve(cls, images: dict[Path, EntryImage], name: str, bound_gb: float | None) -> EntryWrite:
        """A write of `images` to their entries, with room made in the cache (the entries
        themselves kept) and each entry's file made under its temporary name, its space
        reserved. Raises OSError (or ValueError, RuntimeError) where the cache cannot take
        them; nothing is left behind then."""
        write = cls(images, name)
        new_bytes = sum(image.size for image in images.values())
        make_room(next(iter(images)).parent, new_bytes, set(images), bound_gb)
        try:
            for path, image in images.items():
                staging = disk_cache.staged(path)
                write._staged[path] = (staging, staging.__enter__())
                image.reserve(write._staged[path][1])
        except BaseException:
            write._abandon()
            raise
        return write

    def start(self) -> None:
        atexit.register(self.finish)  # a process that ends normally finishes its writes
        super().start()

    def run(self) -> None:
        _lower_own_priority()
        descriptors: dict[Path, int] = {}
        try:
            for path, (_, staging) in self._staged.items():
                descriptors[path] = os.open(staging, os.O_RDWR)
                self.images[path].write(descriptors[path], self._stopping.is_set)
            for path in list(self._staged):
                staging, _ = self._staged.pop(path)
                staging.__exit__(None, None, None)  # renamed into place, whole
            for path, descriptor in descriptors.items():  # the files written, wherever they are now
                self.images[path].map_written(descriptor)
        except WriteStopped:
            self.failure = "stopped before its end"
        except (OSError, ValueError, RuntimeError) as error:
            self.failure = first_line(error)
            _unreported_failures().append(f"packed cache not written ({self.failure})")
        finally:
            self._abandon()
            for descriptor in descriptors.values():
                os.close(descriptor)
            self.images = {}  # the models hold them; a load from now on finds the entries
            atexit.unregister(self.finish)  # nothing left to finish

    def stop(self) -> None:
        """End the write where it is (its temporary files removed), waiting for the piece
        under way."""
        self._stopping.set()
        if self.is_alive():
            self.join()

    def finish(self) -> None:
        """Wait for the write to end; Ctrl-C stops it instead."""
        atexit.unregister(self.finish)
        try:
            while self.is_alive():
                self.join(0.1)  # a join that Ctrl-C interrupts
        except KeyboardInterrupt:
            self.stop()

    def _abandon(self) -> None:
        """Remove the temporary files of entries not renamed into place."""
        for staging, _ in self._staged.values():
            try:
                staging.__exit__(WriteStopped, WriteStopped(), None)
            except WriteStopped:
                pass
        self._staged.clear()


def _lower_own_priority() -> None:
    """This thread at the lowest priority (Linux sets a thread's own): the chat keeps the
    cores; the disk's pace bounds the write anyway."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
        except OSError:
            pass


def writes_under_way() -> list[EntryWrite]:
    """The entry writes of this process still running."""
    return [thread for thread in threading.enumerate() if isinstance(thread, EntryWrite) and thread.is_alive()]


def images_being_written(paths: set[Path]) -> dict[Path, EntryImage] | None:
    """The images of this process's write under way of exactly these entries (a second load
    of a model whose first load is still being written shares them), or None."""
    for write in writes_under_way():
        images = write.images  # emptied when the write ends
        if set(images) == paths:
            return images
    return None


@functools.cache  # one list a process, as its threads are
def _unreported_failures() -> list[str]:
    return []


def write_failures() -> list[str]:
    """The lines of writes that failed since this was last asked (a chat shows each once)."""
    failures = _unreported_failures()
    lines, failures[:] = failures[:], []
    return lines


def finish_writes(say: Callable[[str], None] = lambda line: None) -> list[str]:
    """Wait for this process's entry writes to end (saying so where they take more than a
    moment; Ctrl-C stops them): the failures not yet shown, one line each."""
    under_way = writes_under_way()
    for write in under_way:
        write.join(NOTICEABLE_SECONDS)
    if any(write.is_alive() for write in under_way):
        names = ", ".join(sorted({write.model_name for write in under_way}))
        say(f"writing the packed cache of {names} for later starts, once (Ctrl-C leaves it for the next run)")
    for write in under_way:
        write.finish()
    return write_failures()
