"""Which chat format a model gets: the one asked for, else its own template, else a guess."""

from __future__ import annotations

from collections.abc import Iterable

from llama_chat.errors import LlamaChatError
from llama_chat.text.builtin_formats import ChatMLFormat, GemmaFormat, Llama2Format, Llama3Format, PlainFormat
from llama_chat.text.chat_format import FORMAT_NAMES, ChatFormat
from llama_chat.text.tokenizer import Tokenizer


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


BUILT_IN = {"llama2": Llama2Format, "llama3": Llama3Format, "chatml": ChatMLFormat, "gemma": GemmaFormat,
            "plain": PlainFormat}


def get_chat_format(
    name: str | None,
    tokenizer: Tokenizer,
    template: str | None = None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    *,
    special_tokens: Iterable[str] | None = None,
    origin: str = "the model",
    context_length: int = 0,
) -> ChatFormat:
    """The chat format to use: `name` if given (one of FORMAT_NAMES), else the model's
    template if it has one, else a built-in format guessed from the tokenizer.

    `template`, `bos_token` and `eos_token` come from the model's files (names of the bos and
    eos tokens; the tokenizer's are used when None). For a template, the names of the
    tokenizer's special tokens are needed: `special_tokens`, or else the tokenizer's
    `special_token_names() -> Iterable[str]` method. `origin` names the model's file in
    what a template's errors say, and `context_length` bounds how much text it may write.
    """
    if name is None:
        name = "template" if template is not None else guess_format_name(tokenizer)
    if name == "template":
        if template is None:
            raise LlamaChatError(
                "the model has no chat template; use --chat-format llama2, llama3, chatml, gemma or plain"
            )
        from llama_chat.text.template_format import TemplateFormat  # Jinja, only for a template

        names = _special_token_names(tokenizer, special_tokens)
        return TemplateFormat(template, tokenizer, bos_token, eos_token, names, origin, context_length)
    if name not in BUILT_IN:
        raise LlamaChatError(f"unknown chat format {name!r}; choose one of {', '.join(FORMAT_NAMES)}")
    return BUILT_IN[name](tokenizer)
