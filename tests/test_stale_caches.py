"""A conversation's saved cache opened where its model changed: other weights at the same
path (same size, same modification time), another weights mode, a context too small for
it. Each is refused in one line, the conversation opens whole, and its prompt is fed to
the model again."""

import os
import shutil
from pathlib import Path

import pytest

import llama_chat.cli.chat
from llama_chat.cli import main

from .hf_reference import random_hf_model
from .test_cli import typed_chats
from .test_gguf import tiny_hf_model, write_gguf
from .test_hf_checkpoint import BOS, EOT, VOCAB, save_model_directory

GREEDY = ["--compile", "off", "--temperature", "0", "--max-tokens", "4", "--stats"]
DENSE = ["--quantize", "none", "--dtype", "float32"]
FIRST, NEXT = "hello there", "and now?"
READ_AGAIN = "the conversation is read again"


@pytest.fixture
def answered(monkeypatch):
    """What each one-shot reply started from: (the conversation's messages, cached positions)."""
    seen = []
    answer_once = llama_chat.cli.chat.answer_once

    def recording(session, *arguments):
        seen.append(([message["content"] for message in session.conversation.messages()], len(session.cache)))
        return answer_once(session, *arguments)

    monkeypatch.setattr(llama_chat.cli.chat, "answer_once", recording)
    return seen


def chat(capsys, model: Path, *flags: str) -> str:
    """One reply of llama-chat on `model`; its stderr."""
    assert main(["-m", str(model), *GREEDY, *flags]) == 0
    return capsys.readouterr().err


def prompt_tokens(err: str) -> tuple[int, int]:
    """(new, cached) tokens of the prompt, from the --stats line."""
    new, cached = err.splitlines()[-1].split("prompt ")[1].removesuffix(" cached tokens").split(" new + ")
    return int(new), int(cached)


def opening_line(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith(("llama-chat: opened", "llama-chat: resumed")))


def refused(conversation: Path, reason: str, verb: str = "opened") -> str:
    return (f"llama-chat: {verb} {conversation}: 1 exchange, 0 tokens cached; "
            f"its saved cache was not used ({reason}): {READ_AGAIN}")


def write_model(kind: str, where: Path, seed: int) -> Path:
    """A tiny model: a GGUF file, or a Hugging Face folder whose weights file is the one
    rewritten (the tokenizer and configs stay)."""
    if kind == "gguf":
        return write_gguf(where / "tiny.gguf", tiny_hf_model(seed=seed))
    folder = where / "tiny-hf"
    if not folder.exists():
        save_model_directory(folder)
    other = where / f"seed-{seed}"
    random_hf_model(seed=seed, vocab_size=VOCAB, tie_word_embeddings=False, bos_token_id=BOS,
                    eos_token_id=EOT).save_pretrained(other)
    shutil.copyfile(other / "model.safetensors", folder / "model.safetensors")
    return folder


def files_of(model: Path) -> list[Path]:
    return sorted(model.iterdir()) if model.is_dir() else [model]


@pytest.mark.parametrize("kind", ["gguf", "hf folder"])
def test_other_weights_of_the_same_size_and_time_at_the_same_path(tmp_path, capsys, answered, kind):
    """Identity by size and modification time alone would take the new weights for the
    old; the sampled hash of each file's contents tells them apart."""
    model = write_model(kind, tmp_path, seed=5)
    conversation = tmp_path / "chat.json"
    chat(capsys, model, *DENSE, "-p", FIRST, "--save", str(conversation))
    kept = chat(capsys, model, *DENSE, "--open", str(conversation), "-p", NEXT)
    new, cached = prompt_tokens(kept)
    assert cached > 5 and f"1 exchange, {cached} tokens cached" in opening_line(kept)

    before = {path: (path.read_bytes(), path.stat()) for path in files_of(model)}
    write_model(kind, tmp_path, seed=6)
    for path, (contents, stat) in before.items():
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    assert any(path.read_bytes() != contents for path, (contents, _) in before.items())

    err = chat(capsys, model, *DENSE, "--open", str(conversation), "-p", NEXT)
    assert opening_line(err) == refused(conversation, "it was made with another model file")
    assert prompt_tokens(err) == (new + cached, 0)
    messages, cached_at_start = answered[-1]
    assert messages[0] == FIRST and len(messages) == 2 and cached_at_start == 0


# Weights modes: flags, and the environment they run under.
MODES = {
    "none": (DENSE, {}),
    "bfloat16": (["--quantize", "none", "--dtype", "bfloat16"], {}),
    "int8": (["--quantize", "int8"], {}),
    "int4": (["--quantize", "int4"], {}),
    "8-bit prompt steps": (["--quantize", "int8"], {"LLAMA_CHAT_ACTIVATION_BITS": "8"}),
    "float32 kernels": (["--quantize", "int8", "--dtype", "float32", "--kernel-dtype", "float32"],
                        {"LLAMA_CHAT_KERNELS": "aten"}),
    "bfloat16 kernels": (["--quantize", "int8", "--dtype", "float32", "--kernel-dtype", "bfloat16"],
                         {"LLAMA_CHAT_KERNELS": "aten"}),
}


@pytest.mark.parametrize("saved_in, opened_in", [
    ("none", "int8"), ("int8", "int4"), ("none", "bfloat16"),
    # the activation bits are those of llama-chat's kernels; PyTorch's prompt steps have none
    pytest.param("int8", "8-bit prompt steps", marks=pytest.mark.needs_kernels),
    ("float32 kernels", "bfloat16 kernels"),
])
def test_a_cache_saved_under_another_weights_mode(tmp_path, capsys, monkeypatch, answered, saved_in, opened_in):
    """--resume, as after restarting the chat with other flags: the keys and values
    differ with how the weights are multiplied, not only with how they are stored."""
    model = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5))

    def chat_in(mode: str, *flags: str) -> str:
        mode_flags, environment = MODES[mode]
        with monkeypatch.context() as scoped:
            for name, value in environment.items():
                scoped.setenv(name, value)
            return chat(capsys, model, *mode_flags, *flags)

    chat_in(saved_in, "-p", FIRST)  # kept in the history, its cache beside it
    same = chat_in(saved_in, "--resume", "-p", NEXT)
    new, cached = prompt_tokens(same)
    assert cached > 5 and f"1 exchange, {cached} tokens cached" in opening_line(same)

    err = chat_in(opened_in, "--resume", "-p", NEXT)
    assert opening_line(err) == (
        "llama-chat: resumed conversation 1 of the history: 2 exchanges, 0 tokens cached; its saved cache was "
        f"not used (it was made with another weights mode): {READ_AGAIN}"
    )
    assert prompt_tokens(err)[1] == 0 and prompt_tokens(err)[0] > new + cached
    messages, cached_at_start = answered[-1]
    assert messages[0] == FIRST and len(messages) == 4 and cached_at_start == 0


def test_more_saved_positions_than_a_smaller_context_holds(tmp_path, capsys, monkeypatch):
    """/open in the chat with --ctx-size at the saved positions: refused, the exchange kept;
    one position more and the cache is used."""
    model = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(seed=5))
    conversation = tmp_path / "chat.json"
    chat(capsys, model, *DENSE, "-p", FIRST, "--save", str(conversation))
    held = prompt_tokens(chat(capsys, model, *DENSE, "--open", str(conversation), "-p", NEXT))[1]

    sessions, shown = typed_chats(monkeypatch, [f"/open {conversation}", "/quit"], [f"/open {conversation}", "/quit"])
    for context in (held, held + 1):
        assert main(["-m", str(model), *GREEDY, *DENSE, "--ctx-size", str(context)]) == 0
    small, roomy = sessions
    text = " ".join(shown.getvalue().split())  # the console wraps long notes
    reason = f"chat.kv.safetensors holds {held} positions, too many for a context of {held} tokens"
    assert f"its saved cache was not used ({reason}): {READ_AGAIN}" in text
    assert text.count("its saved cache was not used") == 1 and text.count(f"opened {conversation}: 1 exchange") == 2
    assert [exchange.user for exchange in small.conversation.exchanges] == [FIRST] and len(small.cache) == 0
    assert [exchange.user for exchange in roomy.conversation.exchanges] == [FIRST] and len(roomy.cache) == held
