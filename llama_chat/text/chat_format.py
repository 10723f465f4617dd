"""Chat formats: a conversation to token ids, and the ids that end a reply.

A conversation is a list of messages {"role": "system" | "user" | "assistant", "content": str}.

Built-in formats (llama3, llama2, chatml, plain) are encoded at the token level, as Meta's
reference does: control tokens are looked up by name and appended as ids, and message text
goes through `tokenizer.encode`, which treats it as plain text. So a user who types
"<|eot_id|>" or "<|im_end|>" gets those characters, never the control token.

A model's own Jinja template ("template" format) is in template_format.py.

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

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence

from llama_chat.errors import LlamaChatError
from llama_chat.text.tokenizer import Tokenizer

Message = Mapping[str, str]

ROLES = ("system", "user", "assistant")
FORMAT_NAMES = ("llama2", "llama3", "chatml", "plain", "template")

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
        """Token ids of the whole conversation, ending with the assistant's cue if asked."""


def check_messages(messages: Sequence[Message]) -> None:
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise LlamaChatError(
                f"a message has role {role!r}; conversations use the roles {', '.join(ROLES)}"
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


class Llama3Format(ChatFormat):
    """<|begin_of_text|>, then per message <|start_header_id|>role<|end_header_id|>\\n\\n
    content<|eot_id|>, as Meta's Llama 3 reference encodes it (content stripped)."""

    name = "llama3"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.begin, self.start_header, self.end_header, self.end_of_turn = control_ids(
            tokenizer,
            self.name,
            ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        )
        optional = (tokenizer.token_id("<|end_of_text|>"), tokenizer.token_id("<|eom_id|>"))
        self.turn_end_ids = frozenset([self.end_of_turn, *(i for i in optional if i is not None)])

    def _header(self, role: str) -> list[int]:
        encode = self.tokenizer.encode
        return [self.start_header, *encode(role), self.end_header, *encode("\n\n")]

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        check_messages(messages)
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
                + PICK_ANOTHER
            )
        self.tokenizer = tokenizer

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
        check_messages(messages)
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
        self.start, self.end = control_ids(tokenizer, self.name, ["<|im_start|>", "<|im_end|>"])
        self.turn_end_ids = frozenset({self.end})

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        check_messages(messages)
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

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        check_messages(messages)
        return self.tokenizer.encode("".join(m["content"] for m in messages), add_bos=True)


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
        from llama_chat.text.template_format import TemplateFormat  # Jinja, only for a template

        names = _special_token_names(tokenizer, special_tokens)
        return TemplateFormat(template, tokenizer, bos_token, eos_token, names)
    if name not in _BUILT_IN:
        raise LlamaChatError(f"unknown chat format {name!r}; choose one of {', '.join(FORMAT_NAMES)}")
    return _BUILT_IN[name](tokenizer)
