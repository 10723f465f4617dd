"""The command line given hostile files: exit code 1 and one line on stderr naming the file,
never a traceback (the reported cases of "Nothing in a model file or a saved file can hang,
crash or flood llama-chat"; each reader's own cases are in its tests)."""

import struct
import subprocess
import sys

import pytest

import llama_chat.cli.loaders
from llama_chat.checkpoints.gguf import load_gguf
from llama_chat.cli import main
from llama_chat.errors import LlamaChatError

from .test_gguf import gguf_entry, gguf_text, raw_gguf, tiny_hf_model, write_gguf
from .test_session import chat_model

ARRAY_VALUE, U32 = 9, 4


def arrays_nested_200000_deep(path):
    nested = struct.pack("<IQ", ARRAY_VALUE, 1) * 200_000 + struct.pack("<IQ", U32, 0)
    return raw_gguf(path, [gguf_entry("deep", ARRAY_VALUE, nested)])


def alignment_zero(path):
    return raw_gguf(path, [gguf_entry("general.alignment", U32, struct.pack("<I", 0))])


@pytest.mark.parametrize("write, reason", [
    (arrays_nested_200000_deep, "metadata arrays nested more than 4 deep"),
    (alignment_zero, "general.alignment is 0, not a power of two up to 1048576"),
])
def test_a_hostile_gguf_is_one_line_and_exit_code_1(tmp_path, capsys, write, reason):
    path = write(tmp_path / "hostile.gguf")
    assert main(["--model", str(path), "-p", "hi"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"llama-chat: {path}: the GGUF file is truncated or corrupt ({reason}); download it again\n"


def test_a_conversation_nested_200000_deep_is_one_line_and_exit_code_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(llama_chat.cli.loaders, "load", lambda path, options, **keywords: chat_model())
    path = tmp_path / "chat.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    assert main(["--model", "tiny.gguf", "--open", str(path), "-p", "hi"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"llama-chat: {path} is not a llama-chat conversation (JSON nested more than 64 levels deep)\n"


def test_the_command_run_as_a_program_prints_no_traceback(tmp_path):
    path = arrays_nested_200000_deep(tmp_path / "hostile.gguf")
    finished = subprocess.run([sys.executable, "-m", "llama_chat", "--model", str(path), "-p", "hi"],
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 1 and finished.stdout == ""
    assert finished.stderr.count("\n") == 1 and "Traceback" not in finished.stderr
    assert finished.stderr.startswith(f"llama-chat: {path}: the GGUF file is truncated or corrupt (")


def test_info_shows_a_files_name_and_license_as_text_of_a_line(tmp_path, capsys):
    def words(writer):
        writer.add_name("\x1b]0;owned\x07\x1b[2Jtiny")
        writer.add_license("free " * 100_000)

    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model(), extra=words)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "name:          \\x1b]0;owned\\x07\\x1b[2Jtiny\n" in out
    license_line = next(line for line in out.splitlines() if line.startswith("license:"))
    assert license_line == "license:       " + ("free " * 40) + "…"


def tiny_gguf_with_u32(path, key, written, claimed):
    """The tiny model's GGUF, its u32 entry `key` (written as `written`) set to `claimed`."""
    path = write_gguf(path, tiny_hf_model())
    entry = gguf_text(key) + struct.pack("<II", U32, written)
    data = path.read_bytes()
    assert data.count(entry) == 1
    path.write_bytes(data.replace(entry, gguf_text(key) + struct.pack("<II", U32, claimed)))
    return path


def test_a_gguf_claiming_two_billion_layers_is_refused_before_its_tensor_names_are_listed(tmp_path):
    path = tiny_gguf_with_u32(tmp_path / "layers.gguf", "llama.block_count", 2, 2**31)
    with pytest.raises(LlamaChatError, match="llama.block_count is 2147483648, more layers than llama-chat runs"):
        load_gguf(path)


def test_a_context_of_two_billion_tokens_is_read_as_the_longest_llama_chat_builds(tmp_path):
    path = tiny_gguf_with_u32(tmp_path / "context.gguf", "llama.context_length", 128, 2**31)
    assert load_gguf(path).args.max_seq_len == 2**18  # its rotary tables: 16 MB, not 128 GB
