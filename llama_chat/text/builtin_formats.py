"""The chat formats llama-chat knows itself (llama3, llama2, chatml, gemma, plain), encoded at the
token level: control tokens are appended as ids, message text goes through `encode`."""

from __future__ import annotations

from collections.abc import Sequence

from llama_chat.errors import LlamaChatError
from llama_chat.text.chat_format import PICK_ANOTHER, ChatFormat, Message, check_messages, control_ids
from llama_chat.text.tokenizer import Tokenizer


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
    The closing "[/INST]" is the generation prompt, so `add_generation_prompt` changes nothing.
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
    """<|im_start|>role\\ncontent<|im_end|>\\n per message; the generation prompt is <|im_start|>assistant\\n."""

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


class GemmaFormat(ChatFormat):
    """Gemma's turns: <bos>, then per message <start_of_turn>role\ncontent<end_of_turn>\n, the
    assistant's role called "model" and the content stripped; Gemma has no system role, so
    a system prompt opens the first user message, followed by a blank line (as Gemma's own
    template places it). The generation prompt is <start_of_turn>model\n."""

    name = "gemma"
    ROLE_NAMES = {"user": "user", "assistant": "model"}

    def __init__(self, tokenizer: Tokenizer) -> None:
        if tokenizer.bos_id is None:
            raise LlamaChatError(f"the tokenizer has no bos token, needed by the gemma chat format; {PICK_ANOTHER}")
        self.tokenizer = tokenizer
        self.start, self.end = control_ids(tokenizer, self.name, ["<start_of_turn>", "<end_of_turn>"])
        self.turn_end_ids = frozenset({self.end})

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        check_messages(messages)
        encode = self.tokenizer.encode
        system = ""
        if messages and messages[0]["role"] == "system":
            system, messages = messages[0]["content"] + "\n\n", messages[1:]
        ids = [self.tokenizer.bos_id]
        for index, message in enumerate(messages):
            if message["role"] == "system":
                raise LlamaChatError("the gemma chat format takes a system message only at the start")
            prefix = system if index == 0 and message["role"] == "user" else ""
            text = f"{self.ROLE_NAMES[message['role']]}\n{prefix}{message['content'].strip()}"
            ids += [self.start, *encode(text), self.end, *encode("\n")]
        if add_generation_prompt:
            ids += [self.start, *encode("model\n")]
        return ids


class PlainFormat(ChatFormat):
    """No template: the contents concatenated as completion text, after the bos token where
    the model's tokenizer puts one before a text (its `add_bos_token`, as llama.cpp and
    transformers read it from the model's files)."""

    name = "plain"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        check_messages(messages)
        text = "".join(m["content"] for m in messages)
        return self.tokenizer.encode(text, add_bos=self.tokenizer.add_bos_token)
