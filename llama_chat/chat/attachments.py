"""Files read into the next message (`/read PATH...`, `-f PATH`): each text file goes in
with its name, in a fenced block, before what the person types.

A file must be a regular, readable file of UTF-8 text (no NUL bytes) that fits the space
left in the context; anything else is refused in one line naming the file, and nothing is
added. What was read becomes part of the message it goes with, so a saved conversation
keeps it.
"""

from __future__ import annotations

import glob
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llama_chat.errors import LlamaChatError
from llama_chat.paths import expanded

if TYPE_CHECKING:
    from llama_chat.chat.session import Session

# Read no further than this: a file this large is more than any context holds.
MAX_FILE_BYTES = 8 << 20


@dataclass(frozen=True)
class Attachment:
    name: str  # as the person named it (what the model is told)
    text: str
    tokens: int

    def block(self) -> str:
        """The file as the message shows it: its name, then its text in a fence longer
        than any run of backticks inside it."""
        longest = max((len(run) for run in re.findall(r"`{3,}", self.text)), default=0)
        fence = "`" * max(3, longest + 1)
        return f"{self.name}:\n{fence}\n{self.text.rstrip(chr(10))}\n{fence}\n"


def matching_paths(pattern: str) -> list[str]:
    """The paths a /read argument names: itself, or what a glob pattern matches (sorted)."""
    if not glob.has_magic(pattern):
        return [pattern]
    matches = sorted(path for path in glob.glob(str(expanded(pattern)), recursive=True) if Path(path).is_file())
    if not matches:
        raise LlamaChatError(f"{pattern}: no file matches")
    return matches


def read_attachment(name: str) -> str:
    """A file's text; LlamaChatError (one line) for what is missing, not a regular file,
    unreadable, too large or not UTF-8 text."""
    path = expanded(name)
    try:
        status = path.stat()
    except FileNotFoundError:
        raise LlamaChatError(f"{name}: no such file") from None
    except OSError as error:
        raise LlamaChatError(f"{name}: cannot be read ({error.strerror})") from None
    if stat.S_ISDIR(status.st_mode):
        raise LlamaChatError(f"{name} is a folder; /read takes text files (a folder's files: /read {name}/*)")
    if not stat.S_ISREG(status.st_mode):
        raise LlamaChatError(f"{name} is not a regular file (a pipe or a device); /read takes text files")
    if status.st_size > MAX_FILE_BYTES:
        raise LlamaChatError(f"{name} is {status.st_size / 1e6:.1f} MB, more than any context holds")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise LlamaChatError(f"{name}: cannot be read ({error.strerror})") from None
    if b"\0" in data:
        raise LlamaChatError(f"{name} holds NUL bytes: it is a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise LlamaChatError(f"{name} is not UTF-8 text (byte {error.start} is not); /read takes text files") from None


class PendingFiles:
    """The files read for the next message."""

    def __init__(self) -> None:
        self.attachments: list[Attachment] = []

    def tokens(self) -> int:
        return sum(attachment.tokens for attachment in self.attachments)

    def add(self, name: str, text: str, tokens: int, space: int) -> Attachment:
        """Hold a file's text for the next message, if it fits in `space` tokens besides
        those already held; else LlamaChatError and nothing held."""
        free = space - self.tokens()
        if tokens > free:
            raise LlamaChatError(f"{name} is {tokens} tokens; the context has room for {max(free, 0)} more: "
                                 "read less, or start llama-chat with a larger --ctx-size")
        attachment = Attachment(name, text, tokens)
        self.attachments.append(attachment)
        return attachment

    def message(self, text: str) -> str:
        """The message to send: the files held, then `text` (clear() them once it is sent)."""
        if not self.attachments:
            return text
        blocks = "\n".join(attachment.block() for attachment in self.attachments)
        return f"{blocks}\n{text}"

    def clear(self) -> None:
        self.attachments = []


def read_into(pending: PendingFiles, pattern: str, session: Session) -> list[Attachment]:
    """Read the files `pattern` names into `pending`, each counted in the session's tokens as
    the message will hold it, within the space the conversation leaves (its reply's reserve
    kept); the first that cannot be read or does not fit raises LlamaChatError (the files
    before it stay read)."""
    space = space_for_files(session)
    read = []
    for name in matching_paths(pattern):
        text = read_attachment(name)
        tokens = len(session.model.tokenizer.encode(Attachment(name, text, 0).block()))
        read.append(pending.add(name, text, tokens, space))
    return read


def space_for_files(session: Session) -> int:
    """Tokens a next message may take: the context less the conversation and the reply's reserve."""
    return session.capacity - session.context_used() - session.reserve()
