"""What a conversation runs on: the model and the file it came from, its KV cache, how it
drafts (prompt lookup or a draft model) and the format replies must follow. Nothing here
knows the conversation's messages: a session is a running model with a conversation, and a
turn needs only this part of it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llama_chat.chat.cache_file import identity as cache_identity
from llama_chat.chat.cache_file import model_source as cache_model_source
from llama_chat.engine.speculation import DraftModel, Speculation, check_same_vocabulary
from llama_chat.errors import UsageError
from llama_chat.llama import Llama
from llama_chat.paths import expanded

if TYPE_CHECKING:  # the grammar engine loads only when a format is chosen
    from llama_chat.engine.constraint import AnswerFormat


def file_of(model: Llama, model_path: str | Path | None) -> str | Path | None:
    """The file or folder the model was read from: where its name led (a Hub id to the
    cache, an ollama name to its blob), else the path given."""
    return model.source.path if model.source is not None else model_path


class RunningModel:
    """The model, its cache and speculation, for one conversation at a time (see session)."""

    def __init__(self, model: Llama, model_path: str | Path | None, context_size: int | None) -> None:
        self.model = model
        self.model_path = absolute(file_of(model, model_path))
        self.context_size = context_size  # as asked for; None: the model's, at most 4096
        self.speculation = Speculation()  # prompt lookup, auto; or a draft model
        self.format: AnswerFormat | None = None  # what replies must look like (engine/constraint)
        self._source: list | None = None  # the model file's identity, for saved caches
        self.cache = model.new_cache(context_size)

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def replace(self, model: Llama, model_path: str | Path | None) -> str | None:
        """Run on other weights, with a new cache. Returns a note when the draft model had to
        be let go (another vocabulary)."""
        capacity = min(self.context_size, model.args.max_seq_len) if self.context_size else None
        cache = model.new_cache(capacity)  # before anything changes: it may not fit in memory
        self.model, self.cache, self.model_path = model, cache, absolute(file_of(model, model_path))
        self._source = None
        draft = self.speculation.draft
        if draft is not None:
            try:
                check_same_vocabulary(model, draft.model)
            except UsageError as error:
                self.speculation.draft = None
                return f"draft model off: {error}"
        return None

    def set_draft(self, draft: Llama | None, path: str | Path | None = None) -> None:
        """Draft with this model (None: by prompt lookup again); one that does not share the
        model's vocabulary is refused (UsageError) and nothing changes."""
        if draft is not None:
            check_same_vocabulary(self.model, draft)
        self.speculation.draft = None if draft is None else DraftModel(draft, absolute(file_of(draft, path)) or "")

    def described(self) -> dict:
        """What a saved conversation records of the model (see conversation_file)."""
        return {"path": self.model_path, "name": self.model.name, "chat_format": self.model.chat_format.name,
                "vocab_size": self.model.tokenizer.vocab_size}

    def is_same_model(self, saved: dict) -> bool:
        """Whether a saved conversation's model is this one (its token ids mean the same)."""
        return (
            saved.get("path") == self.model_path
            and saved.get("chat_format") == self.model.chat_format.name
            and saved.get("vocab_size") == self.model.tokenizer.vocab_size
        )

    def cache_depends_on(self, system: str | None, tools: Sequence[str] = ()) -> dict:
        """What a saved cache stands for (see cache_file), with these tools offered."""
        if self._source is None:  # once per model: saves happen after every input
            self._source = cache_model_source(self.model, self.model_path)
        return cache_identity(self.model, self._source, system, tools)


def absolute(path: str | Path | None) -> str | None:
    return str(expanded(path).absolute()) if path is not None else None
