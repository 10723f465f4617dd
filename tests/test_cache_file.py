"""Saved KV cache files that are malformed (chat/cache_file.py): refused in one line, every
shape and dtype checked before a tensor is read; the conversation opens without them."""

import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from llama_chat.chat.session import Session

from .test_session import GREEDY, chat_model, restored_session, say


@pytest.fixture
def saved(tmp_path):
    session = Session(chat_model(), GREEDY, system="Be brief.", model_path=tmp_path / "model.gguf")
    say(session, "one")
    path, cached = session.save(tmp_path / "chat.json")
    assert cached > 0
    return path


def rewritten(path, change_tensors=None, change_metadata=None) -> None:
    with safe_open(str(path), framework="pt") as saved:
        metadata = saved.metadata()
    tensors = load_file(path)
    save_file((change_tensors or dict)(tensors), path, metadata=(change_metadata or dict)(metadata))


@pytest.mark.parametrize("change_tensors, change_metadata, reason", [
    (None, lambda m: {**m, "depends on": "[1, 2]"}, "chat.kv.safetensors does not say what it was made with"),
    (None, lambda m: {**m, "depends on": "[" * 100_000}, "chat.kv.safetensors does not read back (nested more than 64"),
    (lambda t: {**t, "tokens": t["tokens"].float()}, None,
     "chat.kv.safetensors holds its tokens in another form than a list of ids"),
    (lambda t: {**t, "tokens": t["tokens"][None]}, None,
     "chat.kv.safetensors holds its tokens in another form than a list of ids"),
    (lambda t: {**t, "tokens": torch.cat([t["tokens"], t["tokens"]])}, None,
     "chat.kv.safetensors holds other tokens than the conversation"),
    (lambda t: {**t, "values": t["values"].to(torch.int32)}, None,
     "chat.kv.safetensors holds a I32 cache, this model's is torch.float32"),
    (lambda t: {**t, "keys": t["keys"].half()}, None,
     "chat.kv.safetensors holds a torch.float16 cache, this model's is torch.float32"),
    (lambda t: {**t, "values": t["values"][..., :1].contiguous()}, None,
     "chat.kv.safetensors holds tensors of other shapes than this model's cache"),
    (lambda t: {name: value for name, value in t.items() if name != "values"}, None,
     "chat.kv.safetensors holds other tensors than this model's cache"),
    (lambda t: {**t, "window_keys": t["keys"].clone()}, None,
     "chat.kv.safetensors holds other tensors than this model's cache"),
])
def test_a_malformed_cache_is_refused_in_one_line_and_the_text_kept(tmp_path, saved, change_tensors,
                                                                     change_metadata, reason):
    rewritten(tmp_path / "chat.kv.safetensors", change_tensors, change_metadata)
    opened, note = restored_session(chat_model(), saved, tmp_path / "model.gguf")
    assert note.startswith(f"its saved cache was not used ({reason}") and "\n" not in note
    assert [exchange.user for exchange in opened.conversation.exchanges] == ["one"] and len(opened.cache) == 0
    assert say(opened, "two").stats.reused_tokens == 0  # read again


@pytest.mark.parametrize("header", [
    {"__metadata__": {"kind": 5}},
    {"__metadata__": "kind"},
    {"keys": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}},
])
def test_a_header_the_safetensors_library_refuses_is_one_line(tmp_path, saved, header):
    text = json.dumps(header).encode()
    (tmp_path / "chat.kv.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(4))
    opened, note = restored_session(chat_model(), saved, tmp_path / "model.gguf")
    assert note.startswith("its saved cache was not used (chat.kv.safetensors does not read back (")
    assert "\n" not in note and [exchange.user for exchange in opened.conversation.exchanges] == ["one"]
