"""Hostile inputs for the readers of files from strangers, shared by the suite's property tests
(tests/test_fuzz.py, a few seeded examples each) and the longer campaign (benchmarks/fuzz.py).

Each target starts from a valid file llama-chat wrote or reads (a tiny GGUF, a saved
conversation, its KV cache, a packed-cache entry) and mutates it: bytes overwritten with
boundary values, inserted, deleted, truncated, and structure-aware changes (JSON values
swapped for other types or nested deep, GGUF entries with deep arrays and huge counts).
A target's contract: it returns, or raises the one error type its caller turns into one
line; anything else escaping is a failure. What a reader returns is checked too: a GGUF
checkpoint against the file as the gguf package reads it, a packed-cache entry against
its own header, byte for byte.
"""

from __future__ import annotations

import json
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from llama_chat.chat.cache_file import cache_path
from llama_chat.chat.session import Session
from llama_chat.errors import LlamaChatError
from llama_chat.kernels import packed_cache
from llama_chat.text import template_runner
from llama_chat.text.template_runner import TemplateRunner

from .test_gguf import tiny_hf_model, write_gguf
from .test_packed_cache import write_entry
from .test_session import GREEDY, assert_consistent, chat_model, say

# Little-endian values that sit on the edges of the integer types a header stores.
BOUNDARY_VALUES = [
    b"\x00", b"\xff", b"\x7f", b"\x80", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x00\x00\x00\x80",
    b"\x00" * 8, b"\xff" * 8, struct.pack("<Q", 2**63 - 1), struct.pack("<Q", 2**63), struct.pack("<Q", 2**32),
    struct.pack("<Q", 2**31), struct.pack("<I", 9), struct.pack("<I", 8), b"[", b"{", b'"', b"\\", b"]]]]",
]
DEPTHS = [2, 64, 65, 1000, 200_000]


@st.composite
def byte_mutations(draw, seed: bytes, hot: int) -> bytes:
    """`seed` with a few mutations, most of them in its first `hot` bytes (the header)."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        end = min(len(data), hot) if draw(st.integers(0, 3)) else len(data)
        offset = draw(st.integers(0, max(0, end - 1)))
        kind = draw(st.sampled_from(["overwrite", "overwrite", "random", "insert", "delete", "truncate"]))
        if kind == "overwrite":
            value = draw(st.sampled_from(BOUNDARY_VALUES))
            data[offset : offset + len(value)] = value
        elif kind == "random":
            value = draw(st.binary(min_size=1, max_size=8))
            data[offset : offset + len(value)] = value
        elif kind == "insert":
            data[offset:offset] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[offset : offset + draw(st.integers(1, 16))]
        else:
            del data[offset:]
    return bytes(data)


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=8),
    # no subnormals: the chat turns them off process-wide (flush_denormals), which hypothesis refuses
    st.floats(allow_nan=True, allow_subnormal=False),
)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def json_mutations(draw, document: object) -> bytes:
    """A JSON document with one value somewhere in it replaced: by a value of another type,
    by the same value nested deep, or by a key removed."""
    document = json.loads(json.dumps(document))
    holders = []  # (container, key) of every value in the document

    def collect(value: object) -> None:
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            holders.append((value, key))
            collect(item)

    collect(document)
    container, key = draw(st.sampled_from(holders))
    kind = draw(st.sampled_from(["replace", "replace", "nest", "remove"]))
    if kind == "remove" and isinstance(container, dict):
        del container[key]
        return json.dumps(document).encode()
    if kind == "nest":
        depth = draw(st.sampled_from(DEPTHS))
        marker = "\ue000nested\ue000"
        container[key] = marker
        text = json.dumps(document)
        return text.replace(json.dumps(marker), "[" * depth + json.dumps(draw(json_scalars)) + "]" * depth).encode()
    container[key] = draw(json_values)
    return json.dumps(document).encode()


def _gguf_string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


@st.composite
def gguf_values(draw) -> bytes:
    """A metadata value's type and bytes, valid or not: deep arrays, counts past the file."""
    kind = draw(st.sampled_from(["nested", "count", "string", "scalar"]))
    if kind == "nested":  # arrays of arrays, `depth` deep, the innermost empty
        depth = draw(st.sampled_from(DEPTHS))
        return struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)
    if kind == "count":  # an array of numbers or strings claiming more elements than there are
        element = draw(st.sampled_from([0, 4, 8, 10, 9]))
        return struct.pack("<IIQ", 9, element, draw(st.sampled_from([2**31, 2**40, 2**63 - 1, 2**64 - 1])))
    if kind == "string":
        return struct.pack("<I", 8) + struct.pack("<Q", draw(st.sampled_from([2**31, 2**63, 2**64 - 1])))
    return struct.pack("<I", draw(st.integers(0, 13))) + draw(st.binary(min_size=0, max_size=8))


@st.composite
def gguf_mutations(draw, seed: bytes, hot: int) -> bytes:
    """The seed GGUF with an extra metadata entry first (so the rest is read after it), or
    with bytes mutated."""
    if draw(st.booleans()):
        return draw(byte_mutations(seed, hot))
    key = draw(st.sampled_from([b"general.alignment", b"fuzz.value", b"llama.context_length",
                                b"tokenizer.ggml.tokens", b"tokenizer.chat_template"]))
    entry = _gguf_string(key) + draw(gguf_values())
    (count,) = struct.unpack_from("<Q", seed, 16)
    return seed[:16] + struct.pack("<Q", count + 1) + entry + seed[24:]


@dataclass
class Target:
    """A reader, the strategy of its inputs, and `check(data)`, which feeds it one input;
    `seed`, the valid input the mutations start from (None where there is no one input)."""

    name: str
    inputs: st.SearchStrategy[bytes]
    check: Callable[[bytes], None]
    seed: bytes | None = None


def gguf_target(directory: Path) -> Target:
    from llama_chat.checkpoints.gguf import load_gguf

    # small, so that most mutations land in the header
    seed_path = write_gguf(directory / "seed.gguf", tiny_hf_model(hidden_size=32, intermediate_size=32,
                                                                  num_hidden_layers=1, num_attention_heads=2,
                                                                  num_key_value_heads=1))
    seed = seed_path.read_bytes()
    path = directory / "fuzzed.gguf"

    def check(data: bytes) -> None:
        path.write_bytes(data)
        try:
            checkpoint = load_gguf(path)
        except LlamaChatError:
            return
        assert_gguf_read_as_written(path, checkpoint)

    return Target("gguf", gguf_mutations(seed, hot=_gguf_header_length(seed)), check, seed)


def assert_gguf_read_as_written(path: Path, checkpoint) -> None:
    """A GGUF file that loaded holds what the gguf package (an independent reader) finds in
    it: as many metadata entries and tensors as the header counts, each tensor where that
    reader puts it, inside the file; the checkpoint's layers and vocabulary are the header's,
    and every weight reads whole in the shape the checkpoint gives it."""
    import gguf

    from llama_chat.checkpoints.gguf_file import read_gguf_header

    data = path.read_bytes()
    tensor_count, entry_count = struct.unpack_from("<QQ", data, 8)
    metadata, stored = read_gguf_header(path)
    assert (len(stored), len(metadata)) == (tensor_count, entry_count)
    reader = gguf.GGUFReader(path)  # refuses what a GGUF may not be (a key listed twice, say)
    theirs = {tensor.name: (int(tensor.data_offset), int(tensor.n_bytes), tuple(reversed(tensor.shape.tolist())))
              for tensor in reader.tensors}
    their_keys = {name for name in reader.fields if not name.startswith("GGUF.")}
    data_start = reader.data_offset
    del reader  # its memory map, before the next example rewrites the file
    assert their_keys == set(metadata)
    assert {name: (info.offset, info.n_bytes, info.shape) for name, info in stored.items()} == theirs
    assert all(data_start <= info.offset and info.offset + info.n_bytes <= len(data) for info in stored.values())
    layers = {name.split(".")[1] for name in stored if name.startswith("blk.")}
    assert checkpoint.args.n_layers == len(layers)
    assert checkpoint.args.vocab_size == len(metadata["tokenizer.ggml.tokens"]) == stored["token_embd.weight"].shape[0]
    dense = checkpoint.state_dict()
    assert {name: tuple(dense[name].shape) for name in dense} == {
        name: tuple(weight.shape) for name, weight in checkpoint.tensors.items()}


def _gguf_header_length(seed: bytes) -> int:
    from llama_chat.checkpoints.gguf_file import read_gguf_header

    with tempfile.NamedTemporaryFile(suffix=".gguf") as file:
        file.write(seed)
        file.flush()
        _, tensors = read_gguf_header(Path(file.name))
    return min(info.offset for info in tensors.values())


def _saved_conversation(directory: Path) -> tuple[Session, Path]:
    session = Session(chat_model(), GREEDY)
    say(session, "Hello there")
    say(session, "Tell me more")
    path, _ = session.save(directory / "seed.json")
    return session, path


def conversation_target(directory: Path) -> Target:
    session, seed_path = _saved_conversation(directory)
    seed = seed_path.read_bytes()
    path, saved_cache = directory / "fuzzed.json", cache_path(directory / "fuzzed.json")
    saved_cache.unlink(missing_ok=True)

    def check(data: bytes) -> None:
        path.write_bytes(data)
        opened = Session(session.model, GREEDY)
        try:
            opened.open(path)
        except LlamaChatError:
            return
        if opened.transcript.ids is not None:
            assert_consistent(opened)

    inputs = st.one_of(json_mutations(json.loads(seed)), byte_mutations(seed, hot=len(seed)))
    return Target("conversation", inputs, check, seed)


def kv_cache_target(directory: Path) -> Target:
    session, conversation = _saved_conversation(directory)
    seed = cache_path(conversation).read_bytes()
    (header_length,) = struct.unpack_from("<Q", seed)
    header = json.loads(seed[8 : 8 + header_length])

    def check(data: bytes) -> None:
        cache_path(conversation).write_bytes(data)
        opened = Session(session.model, GREEDY)
        opened.open(conversation)  # a cache that does not read back is a note, never an error
        assert_consistent(opened)

    def safetensors_with(header_bytes: bytes) -> bytes:
        return struct.pack("<Q", len(header_bytes)) + header_bytes + seed[8 + header_length:]

    inputs = st.one_of(byte_mutations(seed, hot=8 + header_length),
                       json_mutations(header).map(safetensors_with))
    return Target("kv-cache", inputs, check, seed)


def packed_entry_target(directory: Path) -> Target:
    import torch

    seed_path = directory / "seed.safetensors"
    weight = torch.arange(96, dtype=torch.uint8).view(4, 24)
    write_entry(seed_path, {"a.weight": weight, "b.scales": torch.ones(4, 2), "tied": weight})
    seed = seed_path.read_bytes()
    (header_length,) = struct.unpack_from("<Q", seed)
    header = json.loads(seed[8 : 8 + header_length])
    path = directory / "fuzzed.safetensors"

    written = {name: (entry["dtype"], entry["shape"]) for name, entry in header.items() if name != "__metadata__"}

    def check(data: bytes) -> None:
        path.write_bytes(data)
        try:
            state = packed_cache.load_entry(path)
        except ValueError:  # the caller removes the entry and packs the weights again
            return
        assert_entry_read_as_written(data, state, written, {"tied": "a.weight"})

    def safetensors_with(header_bytes: bytes) -> bytes:
        return struct.pack("<Q", len(header_bytes)) + header_bytes + seed[8 + header_length:]

    inputs = st.one_of(byte_mutations(seed, hot=8 + header_length), json_mutations(header).map(safetensors_with))
    return Target("packed-entry", inputs, check, seed)


def assert_entry_read_as_written(data: bytes, state: dict, written: dict, aliases: dict) -> None:
    """A packed-cache entry that loaded holds the tensors it was written with (`written`:
    name to dtype and shape; `aliases`: name to the tensor it shares), each tensor's bytes
    (every one read) those its header places in the file."""
    import torch

    from llama_chat.kernels.packed_cache import DTYPE_NAMES

    (length,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + length])
    header.pop("__metadata__")
    assert {name: (DTYPE_NAMES[state[name].dtype], list(state[name].shape)) for name in header} == written
    assert set(state) == set(written) | set(aliases)
    assert all(state[alias] is state[target] for alias, target in aliases.items())
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        held = state[name].reshape(-1).view(torch.uint8).numpy().tobytes()
        assert held == data[8 + length + begin : 8 + length + end], name


# Template pieces that loop, write or build, nested at random.
_TEMPLATE_BODIES = ["x", "{{ 'y' * 1000 }}", "{{ m }}", "{% set ns.s = ns.s ~ ns.s %}", "{{ ns.s | length }}"]


@st.composite
def templates(draw) -> str:
    body = draw(st.sampled_from(_TEMPLATE_BODIES))
    for _ in range(draw(st.integers(0, 3))):
        count = draw(st.sampled_from([1, 10, 1000, 100000]))
        body = f"{{% for m in range({count}) %}}{body}{{% endfor %}}"
    return "{% set ns = namespace(s='ab') %}" + body


def template_target(directory: Path, context_length: int = 2048) -> Target:
    def check(data: bytes) -> None:
        start = time.monotonic()
        runner = TemplateRunner(data.decode(), "fuzzed.gguf", context_length)
        try:
            text = runner.render({"messages": []})
            assert len(text) <= runner.max_chars
        except LlamaChatError:
            pass
        finally:
            runner.close()
        # within the runner's own limits: the renderer's start, then the render
        assert time.monotonic() - start < template_runner.START_SECONDS + template_runner.RENDER_SECONDS

    return Target("template", templates().map(str.encode), check)


TARGETS = {
    "gguf": gguf_target, "conversation": conversation_target, "kv-cache": kv_cache_target,
    "packed-entry": packed_entry_target, "template": template_target,
}
