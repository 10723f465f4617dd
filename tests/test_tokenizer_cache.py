"""A GGUF file's tokenizer kept in the cache folder: built at the first load, read back after."""

import json

import pytest

from llama_chat import paths
from llama_chat.checkpoints import gguf, gguf_split
from llama_chat.checkpoints.gguf import load_gguf
from llama_chat.options import DataFolders
from llama_chat.text import tokenizer_cache
from llama_chat.text.gguf_tokenizer import tokenizer_from_gguf_metadata

from .test_gguf import tiny_hf_model, write_gguf
from .test_hf_tokenizer import byte_level_metadata, spm_metadata, train_sentencepiece

TEXT = "  Hello world, 2024 Привет <tool> the 42\n\ttabs"


@pytest.fixture(scope="module")
def spm_vocabulary(tmp_path_factory) -> dict:
    return spm_metadata(train_sentencepiece(tmp_path_factory.mktemp("spm")))


def spm_gguf(path, vocabulary):
    return write_gguf(path, tiny_hf_model(vocab_size=len(vocabulary["tokenizer.ggml.tokens"])), vocabulary=vocabulary)


def kept_entries() -> list:
    return sorted((paths.cache_root() / "tokenizers").glob("*.json"))


def unbuildable(monkeypatch) -> list:
    """Building a tokenizer from metadata fails the test; the header's keys each read, listed."""
    def build(*_):
        raise AssertionError("the tokenizer was built again")

    monkeypatch.setattr(gguf, "tokenizer_from_gguf_metadata", build)
    read_keys = []
    reading = gguf_split.read_gguf_model

    def recording(path, step_over=frozenset()):
        metadata, tensors, parts = reading(path, step_over)
        read_keys.extend(metadata)
        return metadata, tensors, parts

    monkeypatch.setattr(gguf, "read_gguf_model", recording)
    return read_keys


def test_a_second_load_reads_the_tokenizer_kept_by_the_first(tmp_path, spm_vocabulary, monkeypatch):
    path = spm_gguf(tmp_path / "m.gguf", spm_vocabulary)
    first = load_gguf(path)
    assert len(kept_entries()) == 1
    read_keys = unbuildable(monkeypatch)
    second = load_gguf(path)
    # The vocabulary's arrays were stepped over, not made into Python values.
    assert read_keys and not set(read_keys) & gguf.VOCABULARY_ARRAYS
    for text in (TEXT, "", " ", "<tool><tool>x"):
        assert second.tokenizer.encode(text, add_bos=True) == first.tokenizer.encode(text, add_bos=True)
    ids = first.tokenizer.encode(TEXT)
    assert second.tokenizer.decode([1, *ids, 2]) == first.tokenizer.decode([1, *ids, 2])
    assert (second.bos_token, second.eos_token, second.stop_ids) == (first.bos_token, first.eos_token, first.stop_ids)
    assert second.args == first.args and second.tokenizer.vocab_size == first.tokenizer.vocab_size
    assert second.tokenizer.add_bos_token and second.tokenizer.token_id("<tool>") == first.tokenizer.token_id("<tool>")
    assert [second.tokenizer.token_bytes(i) for i in range(len(spm_vocabulary["tokenizer.ggml.tokens"]))] == [
        first.tokenizer.token_bytes(i) for i in range(len(spm_vocabulary["tokenizer.ggml.tokens"]))]


def test_an_entry_is_json_and_the_librarys_own_json(tmp_path):
    """Read with JSON parsers only: nothing in the cache runs."""
    load_gguf(write_gguf(tmp_path / "m.gguf", tiny_hf_model()))
    settings, library = kept_entries()[0].read_bytes().split(b"\n", 1)
    assert json.loads(settings)["format"] == tokenizer_cache.FORMAT
    assert json.loads(library)["model"]["type"] == "BPE"


def test_a_changed_file_is_never_served_the_tokenizer_of_the_old_one(tmp_path, spm_vocabulary):
    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model())
    byte_level = load_gguf(path).tokenizer.encode(TEXT)
    spm_gguf(path, spm_vocabulary)  # the same name, another vocabulary
    changed = load_gguf(path)
    assert changed.tokenizer.encode(TEXT) != byte_level
    assert changed.tokenizer.encode(TEXT) == tokenizer_from_gguf_metadata(spm_vocabulary).encode(TEXT)
    assert len(kept_entries()) == 1  # the old file's is gone: it can never be read again


@pytest.mark.parametrize("damage", [b"", b"{not json\n{}", b'{"format": 1}\n{}', b"\xff\xfe\n"])
def test_a_damaged_entry_is_removed_and_built_again_with_one_line(tmp_path, capsys, damage):
    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model())
    expected = load_gguf(path).tokenizer.encode(TEXT)
    entry = kept_entries()[0]
    entry.write_bytes(damage)
    capsys.readouterr()
    assert load_gguf(path).tokenizer.encode(TEXT) == expected
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"llama-chat: the kept tokenizer {entry} did not read back (")
    assert lines[0].endswith("; building it again") and "Traceback" not in lines[0]
    assert entry.read_bytes() != damage  # kept anew
    assert load_gguf(path).tokenizer.encode(TEXT) == expected and capsys.readouterr().err == ""


def test_with_the_cache_off_nothing_is_kept(tmp_path, monkeypatch):
    root = paths.cache_root()
    previous = paths.configure(DataFolders(cache_off=True))
    try:
        path = write_gguf(tmp_path / "m.gguf", tiny_hf_model())
        assert load_gguf(path).tokenizer.encode(TEXT) == load_gguf(path).tokenizer.encode(TEXT)
    finally:
        paths.configure(previous)
    assert not (root / "tokenizers").exists()


def test_what_building_warned_of_is_said_at_every_load(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", tiny_hf_model(), vocabulary=byte_level_metadata(pre="no-such-split"))
    for _ in range(2):
        with pytest.warns(UserWarning, match=r"'no-such-split' is unknown"):
            load_gguf(path)
    assert len(kept_entries()) == 1
