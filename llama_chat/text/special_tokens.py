"""Text in which special-token names stand for control ids: for text a model's files supply."""

from __future__ import annotations

import re
from collections.abc import Iterable

from llama_chat.text.tokenizer import Tokenizer


class SpecialTokenSplitter:
    """Encodes text in which special-token names ("<|im_start|>") stand for their ids.

    Only for text the model's files supply (template text), never for what a user typed.
    Names are matched longest first, so "<|im_start|>" wins over a shorter name inside it.
    """

    def __init__(self, tokenizer: Tokenizer, names: Iterable[str]) -> None:
        self.tokenizer = tokenizer
        found = {name: tokenizer.token_id(name) for name in set(names) if name}
        self.ids = {name: token for name, token in found.items() if token is not None}
        longest_first = sorted(self.ids, key=len, reverse=True)
        self.pattern = re.compile("|".join(map(re.escape, longest_first))) if self.ids else None

    def split(self, text: str) -> list[str | int]:
        """Text pieces and control ids, in order (empty pieces left out)."""
        if self.pattern is None:
            return [text] if text else []
        parts: list[str | int] = []
        position = 0
        for match in self.pattern.finditer(text):
            if match.start() > position:
                parts.append(text[position : match.start()])
            parts.append(self.ids[match.group()])
            position = match.end()
        if position < len(text):
            parts.append(text[position:])
        return parts

    def encode(self, text: str) -> list[int]:
        return encode_parts(self.tokenizer, self.split(text))


def encode_parts(tokenizer: Tokenizer, parts: Iterable[str | int]) -> list[int]:
    """Ids for a mix of control ids and plain text; adjacent text is encoded in one call."""
    ids: list[int] = []
    pending: list[str] = []
    for part in parts:
        if isinstance(part, str):
            pending.append(part)
            continue
        if pending:
            ids += tokenizer.encode("".join(pending))
            pending.clear()
        ids.append(part)
    if pending:
        ids += tokenizer.encode("".join(pending))
    return ids
