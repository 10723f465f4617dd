"""Chat formats: a conversation to token ids, and the ids that end a reply. This module holds
what every format shares; the formats are in builtin_formats.py and template_format.py, and
format_choice.py picks one for a model.

A conversation is a list of messages {"role": "system" | "user" | "assistant", "content": str}; with
tools (see tools_format.py) an assistant message may also hold "tool_calls", and "tool" messages
hold results.

Built-in formats (llama3, llama2, chatml, gemma, plain) are encoded at the token level, as Meta's
reference does: control tokens are looked up by name and appended as ids, and message text
goes through `tokenizer.encode`, which treats it as plain text. So a user who types
"<|eot_id|>" or "<|im_end|>" gets those characters, never the control token.

Prefix property (what lets the session reuse its KV cache): for a conversation C ending with
a closed assistant reply, encode(C, add_generation_prompt=False) is a prefix of
encode(C + [user message]). This holds for every built-in format, because each turn ends
with a control id (llama3 <|eot_id|>, llama2 </s>) or with text bounded by control ids
(chatml "<|im_end|>\\n", gemma "<end_of_turn>\\n"), and nothing already encoded depends
on later messages. It holds
for a template when the template renders each message without looking at later ones and
closes a turn with a special token; it fails for templates that rewrite earlier turns (for
example those that drop the reasoning of earlier replies: the session then keeps the
template's own ids for them) or stamp today's date into the system prompt (strftime_now)
across midnight. Also, encode(C + [user]) is a prefix of
encode(C + [user, reply], add_generation_prompt=False) exactly for byte-level tokenizers and
usually for subword ones (the reply's first token may merge with the text before it, as in
llama2's "[/INST] reply"). The session should compute the common prefix, not assume it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from llama_chat.errors import LlamaChatError
from llama_chat.text.tokenizer import Tokenizer

Message = Mapping[str, Any]

ROLES = ("system", "user", "assistant")
TOOL_ROLE = "tool"  # results of tool calls: a template may take them (built-in formats get them as user text)
FORMAT_NAMES = ("llama2", "llama3", "chatml", "gemma", "plain", "template")

# What reasoning models write around their thinking, before the answer.
THINKING_OPEN, THINKING_CLOSE = "<think>", "</think>"

PICK_ANOTHER = "use --chat-format to pick another (" + ", ".join(FORMAT_NAMES) + ")"


class ChatFormat(ABC):
    """Turns a conversation into prompt token ids; `stop_ids` are the ids that end a reply."""

    name: str
    tokenizer: Tokenizer
    turn_end_ids: frozenset[int] = frozenset()  # this format's own ids that close a turn

    @property
    def stop_ids(self) -> frozenset[int]:
        """The model's end ids and the format's turn ends: every id that ends a reply."""
        return self.tokenizer.stop_ids | self.turn_end_ids

    @abstractmethod
    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the whole conversation, ending with the generation prompt if asked."""


def check_messages(messages: Sequence[Message], roles: Sequence[str] = ROLES) -> None:
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role not in roles:
            raise LlamaChatError(
                f"a message has role {role!r}; conversations use the roles {', '.join(roles)}"
            )
        if not isinstance(content, str):
            raise LlamaChatError(f"a {role} message has no text content; give it a string")


def control_ids(tokenizer: Tokenizer, format_name: str, names: Sequence[str]) -> list[int]:
    ids = []
    for name in names:
        token = tokenizer.token_id(name)
        if token is None:
            raise LlamaChatError(
                f"the tokenizer lacks token {name}, needed by the {format_name} chat format; "
                + PICK_ANOTHER
            )
        ids.append(token)
    return ids
