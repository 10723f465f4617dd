"""The sampling a known model's card recommends, for models whose files do not say.

A model file's own sampling keys win over the card, and the user's flags over both
(cli/chat.py applies them in that order); /settings names each value's source.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

CARD = "model card"


@dataclass(frozen=True)
class Card:
    """A family of models, known by a pattern in the names its files give it, and the
    settings its card recommends for chatting (only for models that chat: with a template)."""

    pattern: re.Pattern[str]
    sampling: dict
    reference: str  # where the recommendation is written


CARDS = (
    # SmolLM2's instruct cards (135M, 360M, 1.7B) generate with temperature 0.2 and top-p 0.9.
    Card(re.compile(r"smollm2", re.IGNORECASE), {"temperature": 0.2, "top_p": 0.9},
         "HuggingFaceTB/SmolLM2-135M-Instruct"),
)


def card_sampling(names: Iterable[str], chats: bool) -> dict:
    """The settings the card of the model named so recommends (none for a model that does
    not chat, or that no card here knows)."""
    if not chats:
        return {}
    names = [name for name in names if name]
    for card in CARDS:
        if any(card.pattern.search(name) for name in names):
            return dict(card.sampling)
    return {}
