"""The files beside a checkpoint's weights that make its tokenizer (tokenizer.json,
tokenizer.model, tokenizer_config.json) and hold its chat template."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import tokenizers

from llama_chat.errors import LlamaChatError
from llama_chat.text.hf_tokenizer import HFTokenizer
from llama_chat.text.sentencepiece_tokenizer import SentencePieceTokenizer
from llama_chat.text.tiktoken_tokenizer import TiktokenTokenizer, looks_like_tiktoken
from llama_chat.text.tokenizer import Tokenizer
from llama_chat.untrusted_files import MAX_JSON_FILE_BYTES, read_json_object, read_text_file

MAX_TOKENIZER_JSON_BYTES = 256 * 2**20  # the largest vocabularies' files are near 35 MB


def load_tokenizer_model(path: Path, added_tokens: Mapping[str, int] | None = None, **settings) -> Tokenizer:
    """A tokenizer.model file: Llama 3's tiktoken ranks (text lines) or a SentencePiece protobuf.

    The keyword settings (bos_token, eos_token, end_of_turn_ids, add_bos_token: from a
    Hugging Face tokenizer_config.json) apply to SentencePiece; a tiktoken file is always
    Llama 3's, whose settings are known.
    """
    if not path.is_file():
        raise LlamaChatError(f"{path}: no such file (the model's tokenizer)")
    if looks_like_tiktoken(path):
        return TiktokenTokenizer.llama3(path)
    return SentencePieceTokenizer.from_file(path, added_tokens, **settings)


def hf_tokenizer(directory: Path, tokenizer_config: Mapping, end_ids: Iterable[int]) -> Tokenizer:
    """tokenizer.json when present (it carries the exact pre-tokenizer), else tokenizer.model."""
    json_path = directory / "tokenizer.json"
    if json_path.is_file():
        return tokenizer_from_tokenizer_json(json_path, tokenizer_config, end_ids)
    model_path = directory / "tokenizer.model"
    if model_path.is_file():
        return load_tokenizer_model(
            model_path,
            special_tokens(tokenizer_config),
            bos_token=token_content(tokenizer_config.get("bos_token")),
            eos_token=token_content(tokenizer_config.get("eos_token")),
            end_of_turn_ids=end_ids,
            add_bos_token=tokenizer_config.get("add_bos_token", True),
        )
    raise LlamaChatError(f"{directory}: no tokenizer (tokenizer.json or tokenizer.model)")


def tokenizer_from_tokenizer_json(
    path: Path, tokenizer_config: Mapping, end_of_turn_ids: Iterable[int] = ()
) -> HFTokenizer:
    """A tokenizer.json with the bos/eos names and add_bos_token of its tokenizer_config.json."""
    try:
        backend = tokenizers.Tokenizer.from_str(read_text_file(path, MAX_TOKENIZER_JSON_BYTES))
    except LlamaChatError:
        raise
    except Exception as error:  # tokenizers reports every parse failure as a plain Exception
        raise LlamaChatError(f"{path}: not a readable tokenizer.json ({error})") from None
    bos_name = token_content(tokenizer_config.get("bos_token"))
    eos_name = token_content(tokenizer_config.get("eos_token"))
    bos_id = backend.token_to_id(bos_name) if bos_name else None
    add_bos_token = tokenizer_config.get("add_bos_token")
    if add_bos_token is None:
        # Not configured: the tokenizer's own post-processor says whether it adds bos.
        add_bos_token = bos_id is not None and backend.encode("a").ids[:1] == [bos_id]
    return HFTokenizer(
        backend,
        bos_id=bos_id,
        eos_id=backend.token_to_id(eos_name) if eos_name else None,
        end_of_turn_ids=end_of_turn_ids,
        add_bos_token=bool(add_bos_token),
    )


def special_tokens(tokenizer_config: Mapping) -> dict[str, int]:
    """The special tokens of a tokenizer_config.json's added_tokens_decoder, name to id."""
    decoder = tokenizer_config.get("added_tokens_decoder")
    if not isinstance(decoder, dict):
        return {}
    return {
        entry["content"]: int(token_id)
        for token_id, entry in decoder.items()
        if token_id.isdecimal() and isinstance(entry, dict) and entry.get("special", False)
        and isinstance(entry.get("content"), str)
    }


def chat_template(directory: Path, tokenizer_config: Mapping) -> str | None:
    """The model's chat template: from tokenizer_config.json, else chat_template.jinja / .json."""
    template = tokenizer_config.get("chat_template")
    if template is None:
        jinja_path = directory / "chat_template.jinja"
        if jinja_path.is_file():
            return read_text_file(jinja_path, MAX_JSON_FILE_BYTES)
        template = (read_json_object(directory / "chat_template.json") or {}).get("chat_template")
    if isinstance(template, list):
        # Several named templates (e.g. "default" and "tool_use"): chat uses the default one.
        named = [entry for entry in template if isinstance(entry, dict) and entry.get("name") == "default"]
        template = named[-1].get("template") if named else None
    return template if isinstance(template, str) else None


def token_content(token: object) -> str | None:
    """A tokenizer_config.json token: a plain string or an AddedToken dict with "content"."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) and token else None
