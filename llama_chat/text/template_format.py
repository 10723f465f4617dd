"""A model's own Jinja chat template ("template" format).

The template is rendered in a sandbox (template_sandbox.py), in a process of its own that
runs under limits of time, output and memory (template_runner.py), with every message's content
replaced by a placeholder marker made of private-use characters. The rendered string is
cut at the markers: the template's own text is scanned for special-token names (which
become control ids), while the real contents are put back in as plain text. Adjacent plain
text (template text and contents) is encoded in one `encode` call, the way Hugging Face
tokenizes a rendered template, so subword merges and SentencePiece's leading space come
out the same. A template that trims a content (`| trim`, `.strip()`) is followed: the
markers are padded with a whitespace character and the padding's fate tells how the
template treated the text. Other transformations of the content text (upper-casing, search
and replace) are not followed; a template that mangles a marker gives a LlamaChatError. The
one exception is a reply's thinking: its closing marker is left in the text between two
placeholders, for templates that keep only what follows it in earlier replies.

Tools and tool calls come from strangers too (an MCP server's names and descriptions, the
arguments a model wrote): every string in them that could hold a special-token name, or
that holds a character markers are made of (a private-use icon, say, or a marker spelt
out), is replaced by a marker without padding. So the rendered text outside the markers is
the template's own: no stranger's text can pass for a marker or be taken for a mangled one,
and each comes back as it was. Templates write tools and calls with `tojson` (some write
message contents so too), so a marker found between quotes is put back as JSON string text
(escaped as tojson would have); elsewhere as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from llama_chat.errors import LlamaChatError
from llama_chat.text.chat_format import (
    PICK_ANOTHER,
    ROLES,
    THINKING_CLOSE,
    TOOL_ROLE,
    ChatFormat,
    Message,
    check_messages,
)
from llama_chat.text.special_tokens import SpecialTokenSplitter, encode_parts
from llama_chat.text.template_runner import TemplateRunner, UnusableTemplateError
from llama_chat.text.tokenizer import END_OF_GENERATION_NAMES, Tokenizer

# Tokens a template writes to close a turn: when one appears in the template, the model
# emits it to end its reply.
END_OF_TURN_NAMES = END_OF_GENERATION_NAMES | {"</s>"}

# Placeholder markers: private-use characters, which no template writes and no tokenizer
# merges with template text. The index is spelled with one private-use character per digit.
_MARK_OPEN, _MARK_CLOSE, _MARK_DIGIT0 = "\ue000", "\ue001", 0xE010
# Whitespace padding around a marker; a template that strips the content strips the padding.
_PAD = "\u2003"
_MARKER = re.compile(f"({_PAD}?){_MARK_OPEN}([\ue010-\ue019]+){_MARK_CLOSE}({_PAD}?)")
_MARKER_CHARS = re.compile("[\ue000-\ue019]")
# The characters markers are made of, which a stranger's string must not bring into the
# rendered text as they are.
_RESERVED_CHARS = f"\ue000-\ue019{_PAD}"

TRIAL_CONVERSATION = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "Tell me a joke."},
]


def _marker(index: int) -> str:
    digits = "".join(chr(_MARK_DIGIT0 + int(digit)) for digit in str(index))
    return f"{_PAD}{_MARK_OPEN}{digits}{_MARK_CLOSE}{_PAD}"


def _marker_index(digits: str) -> int:
    return int("".join(str(ord(char) - _MARK_DIGIT0) for char in digits))


class TemplateFormat(ChatFormat):
    """A model's own Jinja chat template, rendered in a sandbox (see the module docstring)."""

    name = "template"

    def __init__(
        self,
        source: str,
        tokenizer: Tokenizer,
        bos_token: str | None,
        eos_token: str | None,
        special_tokens: Iterable[str],
        origin: str = "the model",
        context_length: int = 0,
    ) -> None:
        self.runner = TemplateRunner(source, origin, context_length)
        self.tokenizer = tokenizer
        self.bos_token = bos_token if bos_token is not None else (tokenizer.token_name(tokenizer.bos_id) or "")
        self.eos_token = eos_token if eos_token is not None else (tokenizer.token_name(tokenizer.eos_id) or "")
        # bos/eos are inserted through variables, so they count even if not listed as special.
        names = {*special_tokens, self.bos_token, self.eos_token}
        self.splitter = SpecialTokenSplitter(tokenizer, names)
        # A string of a stranger's without any of these characters holds no special-token name
        # and no marker.
        name_starts = "".join(re.escape(name[0]) for name in self.splitter.ids)
        self.risky = re.compile(f"[{name_starts}{_RESERVED_CHARS}]")
        ends = [tokenizer.token_id(name) for name in END_OF_TURN_NAMES if name in source]
        self.turn_end_ids = frozenset(i for i in (tokenizer.token_id(self.eos_token), *ends) if i is not None)
        self._try_out()

    def _try_out(self) -> None:
        """Render a short conversation once, so that a template that does not compile or runs
        past a limit is refused when the model loads (a `/load` then changes nothing), not at
        the first message. A template may refuse this conversation (a system message, say):
        the chat's own messages decide that later."""
        try:
            self.render(TRIAL_CONVERSATION)
        except UnusableTemplateError:
            raise
        except LlamaChatError:
            pass

    def render(
        self, messages: Sequence[Message], add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The template's text for these messages and tools (special tokens as their names)."""
        return self.runner.render({
            "messages": [dict(message) for message in messages],
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": [dict(tool) for tool in tools] if tools else None,
            "documents": None,
        })

    def encode(
        self, messages: Sequence[Message], add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """The conversation's ids; `tools` (declarations as templates take them) go to the
        template's `tools` variable."""
        check_messages(messages, (*ROLES, TOOL_ROLE))
        texts: list[tuple[str, bool]] = []  # what the markers stand for, and whether it is JSON text

        def marked(text: str) -> str:
            if not text:  # no text to protect, and templates test for ""
                return ""
            texts.append((text, False))
            return _marker(len(texts) - 1)

        def marked_if_risky(text: str) -> str:
            if not self.risky.search(text):
                return text  # no special-token name or marker can be in it: left as the template expects it
            texts.append((text, True))
            return _marker(len(texts) - 1).strip(_PAD)

        def message_shown(message: Message) -> dict[str, Any]:
            shown = dict(message)
            # A reply's closing thinking marker stays in the text the template sees, so that a
            # template that drops earlier thinking (content.split('</think>')[-1]) can.
            if message["role"] == "assistant":
                shown["content"] = THINKING_CLOSE.join(map(marked, message["content"].split(THINKING_CLOSE)))
            else:
                shown["content"] = marked(message["content"])
            for key in message.keys() - {"role", "content"}:  # tool_calls, name, tool_call_id, tools
                shown[key] = _each_string(message[key], marked_if_risky)
            return shown

        rendered = self.render(
            [message_shown(message) for message in messages], add_generation_prompt,
            _each_string(list(tools), marked_if_risky) if tools else None,
        )
        return encode_parts(self.tokenizer, self._parts(rendered, texts))

    def _parts(self, rendered: str, texts: list[tuple[str, bool]]) -> list[str | int]:
        """The rendered text with each marker replaced by what it stands for (JSON-escaped
        where the template put it between quotes)."""
        parts: list[str | int] = []
        position = 0
        for match in _MARKER.finditer(rendered):
            parts += self._template_text(rendered[position : match.start()])
            index = _marker_index(match.group(2))
            if index >= len(texts):  # the template's own text spells a marker
                raise _mangled()
            text, is_json = texts[index]
            text = text if is_json else _restore(text, match)
            quoted = rendered[match.start() - 1 : match.start()] == '"' == rendered[match.end() : match.end() + 1]
            parts.append(json.dumps(text, ensure_ascii=False)[1:-1] if quoted else text)
            position = match.end()
        parts += self._template_text(rendered[position:])
        return parts

    def _template_text(self, text: str) -> list[str | int]:
        if _MARKER_CHARS.search(text):
            raise _mangled()
        return self.splitter.split(text)


def _mangled() -> LlamaChatError:
    return LlamaChatError(
        f"the model's chat template changes message text in a way llama-chat cannot follow safely; {PICK_ANOTHER}"
    )


def _each_string(value: Any, change: Callable[[str], str]) -> Any:
    """`value` (JSON-like: dicts, lists, strings, numbers) with every string, keys included, changed."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, Mapping):
        return {change(key) if isinstance(key, str) else key: _each_string(item, change) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_each_string(item, change) for item in value]
    return value


def _restore(content: str, match: re.Match[str]) -> str:
    """The content as the template would have written it, judged by the padding left."""
    left_kept, right_kept = bool(match.group(1)), bool(match.group(3))
    if not left_kept:
        content = content.lstrip()
    if not right_kept:
        content = content.rstrip()
    return content
