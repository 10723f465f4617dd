"""Streaming detokenisation: text pieces as tokens arrive, never half a character."""

from __future__ import annotations

from llama_chat.text.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class StreamingDetokenizer:
    """Turns a stream of token ids into text pieces that concatenate to decode(all ids).

    Each step decodes a short window: the last tokens already shown (as context, so
    a SentencePiece word-start marker still becomes a space) plus the unshown ones.
    A piece is released only when it does not end in U+FFFD, i.e. when no UTF-8
    character is still waiting for its remaining bytes.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # everything released so far
        self._context_start = 0  # window start: tokens before the unshown ones
        self._shown_end = 0  # tokens before this index have been released as text

    def add(self, token_id: int) -> str:
        """Take one token; return the text it completes ("" if it is still partial)."""
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        shown = decode(self.ids[self._context_start : self._shown_end])
        window = decode(self.ids[self._context_start :])
        if len(window) <= len(shown) or window.endswith(REPLACEMENT) or not window.startswith(shown):
            return ""
        piece = window[len(shown) :]
        self._context_start = self._shown_end
        self._shown_end = len(self.ids)
        self.text += piece
        return piece

    def flush(self) -> str:
        """At the end of the stream: whatever is still held back (even a broken character)."""
        full = self.tokenizer.decode(self.ids)
        rest = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += rest
        self._context_start = self._shown_end = len(self.ids)
        return rest
