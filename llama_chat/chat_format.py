"""Chat formats: a conversation to token ids, and the ids that end a reply.

A conversation is a list of messages {"role": "system" | "user" | "assistant", "content": str}.

Built-in formats (llama3, llama2, chatml, plain) are encoded at the token level, as Meta's
reference does: control tokens are looked up by name and appended as ids, and message text
goes through `tokenizer.encode`, which treats it as plain text. So a user who types
"<|eot_id|>" or "<|im_end|>" gets those characters, never the control token.

A model's own Jinja template ("template" format) is rendered in a sandbox with every
message's content replaced by a placeholder marker made of private-use characters. The
rendered string is cut at the markers: the template's own text is scanned for special-token
names (which become control ids), while the real contents are put back in as plain text.
Adjacent plain text (template text and contents) is encoded in one `encode` call, the way
Hugging Face tokenizes a rendered template, so subword merges and SentencePiece's leading
space come out the same. A template that trims a content (`| trim`, `.strip()`) is followed:
the markers are padded with a whitespace character and the padding's fate tells how the
template treated the text. Other transformations of the content text (upper-casing, search
and replace) are not followed; a template that mangles a marker gives a LlamaChatError.

Prefix property (what lets the session reuse its KV cache): for a conversation C ending with
a closed assistant reply, encode(C, add_generation_prompt=False) is a prefix of
encode(C + [user message]). This holds for every built-in format, because each turn ends
with a control id (llama3 <|eot_id|>, llama2 </s>) or with text bounded by control ids
(chatml "<|im_end|>\\n"), and nothing already encoded depends on later messages. It holds
for a template when the template renders each message without looking at later ones and
closes a turn with a special token; it fails for templates that rewrite earlier turns (for
example those that drop the reasoning of earlier replies) or stamp today's date into the
system prompt (strftime_now) across midnight. Also, encode(C + [user]) is a prefix of
encode(C + [user, reply], add_generation_prompt=False) exactly for byte-level tokenizers and
usually for subword ones (the reply's first token may merge with the text before it, as in
llama2's "[/INST] reply"). The session should compute the common prefix, not assume it.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError, nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import LlamaChatError
from .tokenizer import END_OF_GENERATION_NAMES, Tokenizer

Message = Mapping[str, str]

ROLES = ("system", "user", "assistant")
FORMAT_NAMES = ("llama2", "llama3", "chatml", "plain", "template")

# Tokens a template writes to close a turn: when one appears in the template, the model
# emits it to end its reply.
END_OF_TURN_NAMES = END_OF_GENERATION_NAMES | {"</s>"}

_PICK_ANOTHER = "use --chat-format to pick another (" + ", ".join(FORMAT_NAMES) + ")"


class ChatFormat(ABC):
    """Turns a conversation into prompt token ids; `stop_ids` are the ids that end a reply."""

    name: str
    stop_ids: frozenset[int]

    @abstractmethod
    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the whole conversation, ending with the assistant's cue if asked."""


def _check_messages(messages: Sequence[Message]) -> None:
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise LlamaChatError(
                f"a message has role {role!r}; conversations use the roles {', '.join(ROLES)}"
            )
        if not isinstance(content, str):
            raise LlamaChatError(f"a {role} message has no text content; give it a string")


def _control_ids(tokenizer: Tokenizer, format_name: str, names: Sequence[str]) -> list[int]:
    ids = []
    for name in names:
        token = tokenizer.token_id(name)
        if token is None:
            raise LlamaChatError(
                f"the tokenizer lacks token {name}, needed by the {format_name} chat format; "
                + _PICK_ANOTHER
            )
        ids.append(token)
    return ids


def _stop_ids(tokenizer: Tokenizer, *ids: int | None) -> frozenset[int]:
    """The given ids plus the tokenizer's end-of-sequence id, which always ends a reply."""
    return frozenset(i for i in (*ids, tokenizer.eos_id) if i is not None)


class Llama3Format(ChatFormat):
    """<|begin_of_text|>, then per message <|start_header_id|>role<|end_header_id|>\\n\\n
    content<|eot_id|>, as Meta's Llama 3 reference encodes it (content stripped)."""

    name = "llama3"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.begin, self.start_header, self.end_header, self.end_of_turn = _control_ids(
            tokenizer,
            self.name,
            ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        )
        self.stop_ids = _stop_ids(
            tokenizer,
            self.end_of_turn,
            tokenizer.token_id("<|end_of_text|>"),
            tokenizer.token_id("<|eom_id|>"),
        )

    def _header(self, role: str) -> list[int]:
        encode = self.tokenizer.encode
        return [self.start_header, *encode(role), self.end_header, *encode("\n\n")]

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        _check_messages(messages)
        ids = [self.begin]
        for message in messages:
            ids += self._header(message["role"])
            ids += self.tokenizer.encode(message["content"].strip())
            ids.append(self.end_of_turn)
        if add_generation_prompt:
            ids += self._header("assistant")
        return ids


class Llama2Format(ChatFormat):
    """Meta's Llama 2 chat layout: each exchange is <s>[INST] user [/INST] reply </s>, the
    system prompt wrapped in <<SYS>>...<</SYS>> at the start of the first user message.

    "[INST]" is plain text in Llama 2 (not a control token); only <s> and </s> are ids.
    The closing "[/INST]" is the cue to answer, so `add_generation_prompt` changes nothing.
    """

    name = "llama2"
    BEGIN_INSTRUCTION, END_INSTRUCTION = "[INST]", "[/INST]"
    BEGIN_SYSTEM, END_SYSTEM = "<<SYS>>\n", "\n<</SYS>>\n\n"

    def __init__(self, tokenizer: Tokenizer) -> None:
        if tokenizer.bos_id is None or tokenizer.eos_id is None:
            missing = "<s>" if tokenizer.bos_id is None else "</s>"
            raise LlamaChatError(
                f"the tokenizer lacks token {missing}, needed by the llama2 chat format; "
                + _PICK_ANOTHER
            )
        self.tokenizer = tokenizer
        self.stop_ids = _stop_ids(tokenizer)

    def _dialog(self, messages: Sequence[Message]) -> list[str]:
        """The contents, alternating user and assistant, with the system prompt folded in."""
        roles = [message["role"] for message in messages]
        contents = [message["content"] for message in messages]
        if roles[:1] == ["system"] and roles[1:2] == ["user"]:
            contents[:2] = [self.BEGIN_SYSTEM + contents[0] + self.END_SYSTEM + contents[1]]
            roles = roles[1:]
        expected = ["user", "assistant"] * len(roles)
        if not roles or roles != expected[: len(roles)]:
            raise LlamaChatError(
                "the llama2 chat format needs user and assistant messages taking turns, "
                "starting with a user message (after an optional system message)"
            )
        return contents

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        _check_messages(messages)
        dialog = self._dialog(messages)
        bos, eos, encode = self.tokenizer.bos_id, self.tokenizer.eos_id, self.tokenizer.encode
        ids: list[int] = []
        for prompt, answer in zip(dialog[::2], dialog[1::2]):
            text = f"{self.BEGIN_INSTRUCTION} {prompt.strip()} {self.END_INSTRUCTION} {answer.strip()} "
            ids += [bos, *encode(text), eos]
        if len(dialog) % 2:
            ids += [bos, *encode(f"{self.BEGIN_INSTRUCTION} {dialog[-1].strip()} {self.END_INSTRUCTION}")]
        return ids


class ChatMLFormat(ChatFormat):
    """<|im_start|>role\\ncontent<|im_end|>\\n per message; the cue is <|im_start|>assistant\\n."""

    name = "chatml"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.start, self.end = _control_ids(tokenizer, self.name, ["<|im_start|>", "<|im_end|>"])
        self.stop_ids = _stop_ids(tokenizer, self.end)

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        _check_messages(messages)
        encode = self.tokenizer.encode
        ids: list[int] = []
        for message in messages:
            # Role and content in one encode call, as a tokenizer sees the text between two
            # control tokens of a rendered ChatML template.
            ids += [self.start, *encode(f"{message['role']}\n{message['content']}"), self.end]
            ids += encode("\n")
        if add_generation_prompt:
            ids += [self.start, *encode("assistant\n")]
        return ids


class PlainFormat(ChatFormat):
    """No template: the contents concatenated as completion text, after the bos token."""

    name = "plain"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.stop_ids = _stop_ids(tokenizer)

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        _check_messages(messages)
        return self.tokenizer.encode("".join(m["content"] for m in messages), add_bos=True)


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


# Placeholder markers: private-use characters, which no template writes and no tokenizer
# merges with template text. The index is spelled with one private-use character per digit.
_MARK_OPEN, _MARK_CLOSE, _MARK_DIGIT0 = "\ue000", "\ue001", 0xE010
# Whitespace padding around a marker; a template that strips the content strips the padding.
_PAD = "\u2003"
_MARKER = re.compile(f"({_PAD}?){_MARK_OPEN}([\ue010-\ue019]+){_MARK_CLOSE}({_PAD}?)")
_MARKER_CHARS = re.compile("[\ue000-\ue019]")


def _marker(index: int) -> str:
    digits = "".join(chr(_MARK_DIGIT0 + int(digit)) for digit in str(index))
    return f"{_PAD}{_MARK_OPEN}{digits}{_MARK_CLOSE}{_PAD}"


def _marker_index(digits: str) -> int:
    return int("".join(str(ord(char) - _MARK_DIGIT0) for char in digits))


class _GenerationTag(Extension):
    """{% generation %}...{% endgeneration %}: Hugging Face marks the assistant's part of a
    training example with it; for a prompt it only renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _Sandbox(ImmutableSandboxedEnvironment):
    """A sandbox that stops at the first reach for an unsafe attribute (`__class__`, private
    names, list.append...) instead of rendering it as empty text."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )


class _TemplateRaised(TemplateError):
    """The template called raise_exception(message)."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Hugging Face's version: unlike Jinja's it does not HTML-escape "<" and ">".
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(pattern: str) -> str:
    return datetime.now().strftime(pattern)


def _environment() -> _Sandbox:
    # The settings Hugging Face renders chat templates with, so templates come out the same.
    environment = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


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
    ) -> None:
        try:
            self.template = _environment().from_string(source)
        except TemplateSyntaxError as error:
            raise LlamaChatError(
                f"the model's chat template has a syntax error on line {error.lineno}: "
                f"{error.message}; {_PICK_ANOTHER}"
            ) from None
        except TemplateError as error:  # e.g. an unknown filter, found while compiling
            raise LlamaChatError(f"the model's chat template is invalid: {error}; {_PICK_ANOTHER}") from None
        self.tokenizer = tokenizer
        self.bos_token = bos_token if bos_token is not None else (tokenizer.token_name(tokenizer.bos_id) or "")
        self.eos_token = eos_token if eos_token is not None else (tokenizer.token_name(tokenizer.eos_id) or "")
        # bos/eos are inserted through variables, so they count even if not listed as special.
        names = {*special_tokens, self.bos_token, self.eos_token}
        self.splitter = SpecialTokenSplitter(tokenizer, names)
        ends = [tokenizer.token_id(name) for name in END_OF_TURN_NAMES if name in source]
        self.stop_ids = tokenizer.stop_ids | _stop_ids(tokenizer, tokenizer.token_id(self.eos_token), *ends)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The template's text for these messages (special tokens as their names)."""
        try:
            return self.template.render(
                messages=[dict(message) for message in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                tools=None,
                documents=None,
            )
        except _TemplateRaised as error:
            raise LlamaChatError(f"the model's chat template rejected the conversation: {error}") from None
        except Exception as error:  # the template is foreign code: any failure is the model's
            raise LlamaChatError(
                f"the model's chat template failed: {type(error).__name__}: {error}; {_PICK_ANOTHER}"
            ) from None

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        _check_messages(messages)
        # Empty contents need no marker: there is no text to protect, and templates test for "".
        marked = [
            {**message, "content": _marker(index) if message["content"] else ""}
            for index, message in enumerate(messages)
        ]
        rendered = self.render(marked, add_generation_prompt)
        parts: list[str | int] = []
        position = 0
        for match in _MARKER.finditer(rendered):
            parts += self._template_text(rendered[position : match.start()])
            parts.append(_restore(messages[_marker_index(match.group(2))]["content"], match))
            position = match.end()
        parts += self._template_text(rendered[position:])
        return encode_parts(self.tokenizer, parts)

    def _template_text(self, text: str) -> list[str | int]:
        if _MARKER_CHARS.search(text):
            raise LlamaChatError(
                "the model's chat template changes message text in a way llama-chat cannot "
                f"follow safely; {_PICK_ANOTHER}"
            )
        return self.splitter.split(text)


def _restore(content: str, match: re.Match[str]) -> str:
    """The content as the template would have written it, judged by the padding left."""
    left_kept, right_kept = bool(match.group(1)), bool(match.group(3))
    if not left_kept:
        content = content.lstrip()
    if not right_kept:
        content = content.rstrip()
    return content


def _special_token_names(tokenizer: Tokenizer, special_tokens: Iterable[str] | None) -> Iterable[str]:
    return special_tokens if special_tokens is not None else tokenizer.special_token_names()


def guess_format_name(tokenizer: Tokenizer) -> str:
    """A built-in format from the tokenizer's control tokens; "plain" when unsure."""
    def has(*names: str) -> bool:
        return all(tokenizer.token_id(name) is not None for name in names)

    if has("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"):
        return "llama3"
    if has("<|im_start|>", "<|im_end|>"):
        return "chatml"
    # Llama 1/2's SentencePiece vocabulary: 32000 pieces with <s> and </s> as bos and eos.
    llama2_vocabulary = (
        tokenizer.vocab_size == 32000
        and tokenizer.bos_id is not None
        and tokenizer.token_id("<s>") == tokenizer.bos_id
        and tokenizer.token_id("</s>") == tokenizer.eos_id
    )
    return "llama2" if llama2_vocabulary else "plain"


_BUILT_IN = {"llama2": Llama2Format, "llama3": Llama3Format, "chatml": ChatMLFormat, "plain": PlainFormat}


def get_chat_format(
    name: str | None,
    tokenizer: Tokenizer,
    template: str | None = None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    *,
    special_tokens: Iterable[str] | None = None,
) -> ChatFormat:
    """The chat format to use: `name` if given (one of FORMAT_NAMES), else the model's
    template if it has one, else a built-in format guessed from the tokenizer.

    `template`, `bos_token` and `eos_token` come from the model's files (names of the bos and
    eos tokens; the tokenizer's are used when None). For a template, the names of the
    tokenizer's special tokens are needed: `special_tokens`, or else the tokenizer's
    `special_token_names() -> Iterable[str]` method.
    """
    if name is None:
        name = "template" if template is not None else guess_format_name(tokenizer)
    if name == "template":
        if template is None:
            raise LlamaChatError(
                "the model has no chat template; use --chat-format llama2, llama3, chatml or plain"
            )
        names = _special_token_names(tokenizer, special_tokens)
        return TemplateFormat(template, tokenizer, bos_token, eos_token, names)
    if name not in _BUILT_IN:
        raise LlamaChatError(f"unknown chat format {name!r}; choose one of {', '.join(FORMAT_NAMES)}")
    return _BUILT_IN[name](tokenizer)
