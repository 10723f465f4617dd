"""The packed cache (kernels/packed_cache.py): written once by a first load, behind the
chat (kernels/packed_cache_writer.py), mapped by later ones, never trusted across a changed
source, rebuilt when it does not read back."""

import errno
import gc
import json
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat.cli import main
from llama_chat.cli.options import configure_folders
from llama_chat.errors import CorruptFileError
from llama_chat.kernels import packed_cache
from llama_chat.kernels.block_linear import BlockLinear
from llama_chat.kernels.packed_cache_writer import EntryWrite, finish_writes, writes_under_way

from .loading_helpers import file_blocks, options_from_environment
from .signals import as_a_foreground_job
from .test_gguf import tiny_hf_model, write_gguf


def write_entry(path, state: dict, source: str = "") -> None:
    """`state` as an entry of the packed cache, written as a first load writes one."""
    image = packed_cache.EntryImage(state, source)
    for name, tensor in state.items():
        image.views[name].copy_(tensor)
    write = EntryWrite.reserve({path: image}, source, None)
    write.start()
    write.join()
    assert write.failure == ""


def entries(tmp_cache) -> list:
    return sorted((tmp_cache / "packed").glob("*.safetensors"))


def written() -> None:
    """Wait for the entries this process's first loads are writing behind them."""
    assert finish_writes() == []


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CHAT_CACHE", str(tmp_path / "cache"))
    configure_folders()
    return tmp_path / "cache"


def test_a_state_reads_back_as_views_of_one_mapping(tmp_path):
    table = torch.arange(12, dtype=torch.int8).view(3, 4)
    state = {"a.levels": table, "a.scales": torch.randn(3, 2), "b.levels": table,
             "c.blocks": torch.randint(0, 256, (5, 7), dtype=torch.uint8), "d": torch.randn(4).to(torch.bfloat16)}
    path = tmp_path / "entry.safetensors"
    write_entry(path, state)
    back = packed_cache.load_entry(path)
    assert set(back) == set(state)
    for name, tensor in state.items():
        assert torch.equal(back[name], tensor), name
        assert back[name].untyped_storage().nbytes() == path.stat().st_size  # a view of the one mapping
    assert back["a.levels"] is back["b.levels"]  # a tied table stays one tensor
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_an_entry_that_does_not_read_back_is_refused(tmp_path, damage):
    path = tmp_path / "entry.safetensors"
    write_entry(path, {"w": torch.randn(64, 64)})
    data = path.read_bytes()
    path.write_bytes(data[:-100] if damage == "truncate" else data[:8] + b"{not json" + data[17:])
    with pytest.raises(ValueError):
        packed_cache.load_entry(path)


def edited_entry(path, edit) -> None:
    """Rewrite a saved entry's header as `edit` (a function of the parsed header) says: JSON
    still well-formed, its data left as written."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = edit(json.loads(data[8 : 8 + length]))
    text = json.dumps(header).encode()
    text += b" " * (length - len(text))  # as long as before where it fits: the data stays aligned
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])


def with_entry(name, **changes):
    return lambda header: {**header, name: {**header[name], **changes}}


@pytest.mark.parametrize("edit, reason", [
    (lambda header: [header], "its header is not an object"),
    (lambda header: {**header, "w": [1, 2]}, "tensor 'w' is described by [1, 2]"),
    (with_entry("w", dtype="Q9"), "tensor 'w' has dtype 'Q9'"),
    (with_entry("w", dtype=7), "tensor 'w' has dtype 7"),
    (with_entry("w", shape="64x64"), "tensor 'w' has shape '64x64'"),
    (with_entry("w", shape=[-64, -64]), "tensor 'w' has shape [-64, -64]"),
    (with_entry("w", shape=[64.0, 64]), "tensor 'w' has shape [64.0, 64]"),
    (lambda header: {**header, "w": {"dtype": "F32", "shape": [64, 64]}}, "tensor 'w' has data_offsets None"),
    (with_entry("w", data_offsets=[-16384, 0]), "tensor 'w' has data_offsets [-16384, 0]"),
    (with_entry("w", data_offsets=[0, 2**70]), "tensor 'w' has data_offsets [0, 1180591620717411303424]"),
    (with_entry("w", data_offsets=[16384, 32768]), "its tensors need 32768 bytes of data, the file holds 16384"),
    (with_entry("w", shape=[2**62, 16], data_offsets=[0, 0]), "tensor 'w' has 0 bytes for shape"),
    (lambda header: {**header, "v": header["w"]}, "tensor 'v' overlaps another"),
    (lambda header: {**header, "__metadata__": ["aliases"]}, "its __metadata__ is not an object of strings"),
    (lambda header: {**header, "__metadata__": {**header["__metadata__"], "aliases": '{"x": "missing"}'}},
     "its aliases name tensors it does not hold"),
    (lambda header: {**header, "__metadata__": {**header["__metadata__"], "aliases": "[" * 100 + "]" * 100}},
     "nested more than 64 levels deep"),
    (with_entry("w", dtype="I32"), "its header is not the one it was written with"),
    (with_entry("w", shape=[32, 128]), "its header is not the one it was written with"),
])
def test_a_header_edited_into_other_types_or_sizes_is_refused(tmp_path, edit, reason):
    path = tmp_path / "entry.safetensors"
    write_entry(path, {"w": torch.randn(64, 64)})
    edited_entry(path, edit)
    with pytest.raises(CorruptFileError) as refused:  # a ValueError, as the loader catches it
        packed_cache.load_entry(path)
    assert str(refused.value).startswith(reason) and isinstance(refused.value, ValueError)


@pytest.mark.parametrize("aliases", ["{}", '{"b": "a", "c": "a"}'])
def test_an_entry_whose_aliases_were_edited_is_refused(tmp_path, aliases):
    """A tied table left out (or one name too many) changes no tensor's bytes, dtype or shape,
    but the model would not get the tensors written."""
    path = tmp_path / "entry.safetensors"
    table = torch.randn(8, 4)
    write_entry(path, {"a": table, "b": table})
    edited_entry(path, lambda header: {**header, "__metadata__": {**header["__metadata__"], "aliases": aliases}})
    with pytest.raises(CorruptFileError, match="its header is not the one it was written with"):
        packed_cache.load_entry(path)


@pytest.mark.needs_kernels
def test_a_second_load_maps_the_first_loads_packing(tmp_path, tmp_cache):
    path = write_gguf(tmp_path / "q4_0.gguf", tiny_hf_model(seed=11), qtype=QType.Q4_0)
    first = llama_chat.load(path, options_from_environment(), device="cpu")
    written()
    [entry] = entries(tmp_cache)
    inode = entry.stat().st_ino  # a new entry is a new file, renamed into place
    second = llama_chat.load(path, options_from_environment(), device="cpu")
    assert writes_under_way() == []
    assert entries(tmp_cache) == [entry] and entry.stat().st_ino == inode  # read, not written again
    w2 = second.transformer.layers[1].feed_forward.w2
    assert isinstance(w2, BlockLinear) and w2.blocks.untyped_storage().nbytes() == entry.stat().st_size
    # The weights used are the file's bytes, in the kernels' order.
    stored = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.1.ffn_down.weight")
    file_bytes = torch.from_numpy(np.array(stored.data)).view(torch.uint8).view(w2.out_features, -1)
    assert torch.equal(file_blocks(w2), file_bytes)
    ids = list(range(3, 15))
    assert torch.equal(first.logits(ids), second.logits(ids))


@pytest.mark.needs_kernels
def test_a_changed_source_is_packed_again(tmp_path, tmp_cache):
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=12), qtype=QType.Q4_0)
    before = llama_chat.load(path, options_from_environment(), device="cpu").logits([3, 4, 5])
    write_gguf(path, tiny_hf_model(seed=13), qtype=QType.Q4_0)  # same size, other weights
    after = llama_chat.load(path, options_from_environment(), device="cpu").logits([3, 4, 5])
    written()
    assert len(entries(tmp_cache)) == 2 and not torch.equal(before, after)
    fresh = llama_chat.load(path, options_from_environment(), device="cpu", quantize="auto").logits([3, 4, 5])
    assert torch.equal(after, fresh)


@pytest.mark.needs_kernels
def test_a_damaged_entry_is_rebuilt_with_one_line(tmp_path, tmp_cache):
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=14), qtype=QType.Q4_1)
    expected = llama_chat.load(path, options_from_environment(), device="cpu").logits([3, 4, 5])
    written()
    [entry] = entries(tmp_cache)
    size = entry.stat().st_size
    with entry.open("r+b") as handle:
        handle.truncate(size // 2)
    model = llama_chat.load(path, options_from_environment(), device="cpu")
    assert "packed cache rebuilt (" in model.weights.note and "\n" not in model.weights.note
    written()
    assert entry.stat().st_size == size and torch.equal(model.logits([3, 4, 5]), expected)


@pytest.mark.needs_kernels
def test_an_entry_whose_header_was_edited_consistently_is_rebuilt_not_used(tmp_path, tmp_cache):
    """float32 norm weights relabelled int32: the header still describes the data exactly,
    and the model would take the tensors as they are (with wrong weights)."""
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=14), qtype=QType.Q4_1)
    expected = llama_chat.load(path, options_from_environment(), device="cpu").logits([3, 4, 5])
    written()
    [entry] = entries(tmp_cache)

    def relabelled(header):
        return {name: {**value, "dtype": "I32"} if name.endswith("norm.weight") else value
                for name, value in header.items()}

    edited_entry(entry, relabelled)
    model = llama_chat.load(path, options_from_environment(), device="cpu")
    assert "packed cache rebuilt (its header is not the one it was written with)" in model.weights.note
    assert torch.equal(model.logits([3, 4, 5]), expected)


@pytest.mark.needs_kernels
def test_without_a_cache_the_weights_are_packed_in_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CHAT_CACHE", "off")
    configure_folders()
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=15), qtype=QType.Q4_0)
    model = llama_chat.load(path, options_from_environment(), device="cpu")
    w2 = model.transformer.layers[0].feed_forward.w2
    assert w2.blocks.untyped_storage().nbytes() == w2.blocks.numel()  # its own memory, no mapping
    assert writes_under_way() == [] and finish_writes() == []  # nothing written, nor to write
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["model.gguf"]


def mapped_file(address: int) -> str:
    """The file mapped at `address` in this process ("" for anonymous memory)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(bound, 16) for bound in fields[0].split("-"))
        if start <= address < end:
            return fields[5] if len(fields) == 6 else ""
    raise AssertionError(f"{address:#x} is not mapped")


@pytest.mark.needs_kernels
def test_a_first_load_answers_before_its_entry_is_written_and_the_next_maps_it(tmp_path, tmp_cache, monkeypatch):
    """The entry's write held back: the model answers from private memory, nothing is under
    the entry's name (its space reserved under a temporary one). Let go, the entry holds
    exactly the bytes the model ran on, the model runs on the entry's pages from then on,
    and the next load maps the entry without packing or writing."""
    let_go = threading.Event()
    write = packed_cache.EntryImage.write

    def held_back(image, *arguments):
        assert let_go.wait(60)
        return write(image, *arguments)

    monkeypatch.setattr(packed_cache.EntryImage, "write", held_back)
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=20), qtype=QType.Q4_0)
    first = llama_chat.load(path, options_from_environment(), device="cpu")
    ids = list(range(3, 15))
    answer = first.logits(ids)
    assert entries(tmp_cache) == [] and len(writes_under_way()) == 1
    [staging] = (tmp_cache / "packed").glob("*.partial")
    blocks = first.transformer.layers[1].feed_forward.w2.blocks
    assert staging.stat().st_size == blocks.untyped_storage().nbytes()  # reserved whole, at load
    assert mapped_file(blocks.data_ptr()) == ""  # private memory
    ran_on = {name: tensor.clone() for name, tensor in first.transformer.state_dict().items()}
    let_go.set()
    written()
    [entry] = entries(tmp_cache)
    assert not list((tmp_cache / "packed").glob("*.partial"))
    back = packed_cache.load_entry(entry)
    assert set(back) == set(ran_on) and all(torch.equal(back[name], ran_on[name]) for name in ran_on)
    assert mapped_file(blocks.data_ptr()) == str(entry)  # the entry's pages, where the private ones were
    assert torch.equal(first.logits(ids), answer)
    inode = entry.stat().st_ino
    second = llama_chat.load(path, options_from_environment(), device="cpu")
    assert writes_under_way() == [] and entries(tmp_cache) == [entry] and entry.stat().st_ino == inode
    assert mapped_file(second.transformer.layers[1].feed_forward.w2.blocks.data_ptr()) == str(entry)
    assert torch.equal(second.logits(ids), answer)


@pytest.mark.needs_kernels
def test_a_second_load_while_the_first_is_written_shares_its_memory(tmp_path, tmp_cache, monkeypatch):
    let_go = threading.Event()
    write = packed_cache.EntryImage.write
    monkeypatch.setattr(packed_cache.EntryImage, "write", lambda image, *a: let_go.wait(60) and write(image, *a))
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=21), qtype=QType.Q4_0)
    first = llama_chat.load(path, options_from_environment(), device="cpu")
    second = llama_chat.load(path, options_from_environment(), device="cpu")
    assert len(writes_under_way()) == 1 and len(list((tmp_cache / "packed").glob("*.partial"))) == 1
    blocks = [model.transformer.layers[0].attention.wo.blocks for model in (first, second)]
    assert blocks[0].data_ptr() == blocks[1].data_ptr()  # packed once, held once
    let_go.set()
    written()
    assert len(entries(tmp_cache)) == 1 and torch.equal(first.logits([3, 4, 5]), second.logits([3, 4, 5]))


# The first load of a file, its entry's write stopped for good after its first piece.
WRITES_A_PIECE_THEN_HANGS = (
    "import os, sys, time\n"
    "import llama_chat\n"
    "from llama_chat.cli.options import configure_folders\n"
    "from llama_chat.environment import kernel_options\n"
    "from llama_chat.kernels import packed_cache\n"
    "from llama_chat.options import LoadOptions\n"
    "configure_folders()  # the test's cache and kernels, as the command line takes them\n"
    "packed_cache.WRITE_PIECE = 4096\n"
    "write = os.pwrite\n"
    "def hangs_after_a_piece(descriptor, data, offset):\n"
    "    if offset:\n"
    "        print('mid-write', flush=True)\n"
    "        time.sleep(600)\n"
    "    return write(descriptor, data, offset)\n"
    "os.pwrite = hangs_after_a_piece\n"
    "model = llama_chat.load(sys.argv[1], LoadOptions(kernels=kernel_options()), device='cpu')\n"
    "model.logits([3, 4, 5])\n"
    "print('answered', flush=True)\n"
    "time.sleep(600)\n"
)


def lines_until(descriptor: int, wanted: set[str], seconds: float, errors: Path) -> None:
    """Read lines from the pipe `descriptor` until each of `wanted` has come, within `seconds`
    (`errors`: the process's stderr, shown where they do not come)."""
    deadline, received = time.monotonic() + seconds, b""
    while not wanted <= set(received.decode().splitlines()):
        ready, _, _ = select.select([descriptor], [], [], max(0.0, deadline - time.monotonic()))
        data = os.read(descriptor, 4096) if ready else b""
        assert data, f"waited for {wanted}, got {received!r}; stderr: {errors.read_text()[-3000:]}"
        received += data


@pytest.mark.needs_kernels
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGHUP"])
def test_a_chat_killed_mid_write_leaves_no_entry_and_the_next_load_packs_again(tmp_path, tmp_cache, signal_name):
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=22), qtype=QType.Q4_0)
    with (tmp_path / "stderr").open("w") as errors:
        chat = subprocess.Popen([sys.executable, "-c", WRITES_A_PIECE_THEN_HANGS, str(path)], stdout=subprocess.PIPE,
                                stderr=errors, preexec_fn=as_a_foreground_job)  # a hangup acts as on a terminal
    try:
        lines_until(chat.stdout.fileno(), {"mid-write", "answered"}, 120, tmp_path / "stderr")
        chat.send_signal(getattr(signal, signal_name))
        chat.wait(timeout=60)
    finally:
        chat.kill()
    assert entries(tmp_cache) == []  # nothing under the entry's name
    [left] = (tmp_cache / "packed").glob("*.partial")
    assert f".{chat.pid}." in left.name  # named by the process that died writing it
    model = llama_chat.load(path, options_from_environment(), device="cpu")
    written()  # packed again, and written behind the load
    [entry] = entries(tmp_cache)
    assert not left.exists() and not list((tmp_cache / "packed").glob("*.partial"))
    assert torch.isfinite(model.logits([3, 4, 5])).all()


@pytest.mark.needs_kernels
def test_a_write_that_fails_behind_a_reply_is_one_line(tmp_path, tmp_cache, monkeypatch, capsys):
    """The disk fills after the space was reserved: the reply is given, one line says the
    cache was not written, and nothing is left in the cache."""
    def full(descriptor, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=23), qtype=QType.Q4_0)
    assert main(["--model", str(path), "-p", "hi", "--max-tokens", "3", "--temperature", "0", "--compile", "off"]) == 0
    out, err = capsys.readouterr()
    assert out.strip()
    said = [line for line in err.splitlines() if "packed cache" in line]
    assert said == ["llama-chat: packed cache not written ([Errno 28] No space left on device)"]
    assert not list((tmp_cache / "packed").iterdir())


@pytest.mark.needs_kernels
def test_a_one_shot_reply_finishes_its_write_before_it_exits(tmp_path, tmp_cache, monkeypatch, capsys):
    write = packed_cache.EntryImage.write
    monkeypatch.setattr(packed_cache.EntryImage, "write", lambda image, *a: time.sleep(1.5) or write(image, *a))
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=24), qtype=QType.Q4_0)
    assert main(["--model", str(path), "-p", "hi", "--max-tokens", "3", "--temperature", "0", "--compile", "off"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and writes_under_way() == [] and len(entries(tmp_cache)) == 1
    assert ("llama-chat: writing the packed cache of model.gguf for later starts, once (Ctrl-C leaves it for the "
            "next run)") in err.splitlines()


def test_memory_tells_mapped_pages_from_the_process_own(tmp_path):
    """A mapped file's pages count as resident but not as the process's own memory;
    an allocation counts as both."""
    from llama_chat.process_memory import memory_now_mb

    path = tmp_path / "entry.safetensors"
    write_entry(path, {"w": torch.ones(64 << 20, dtype=torch.uint8)})
    gc.collect()  # earlier tests' garbage, freed between the readings, would lower the second
    resident, own = memory_now_mb()
    mapped = packed_cache.load_entry(path)["w"]
    # A byte of every page read (summing all 64 Mi bytes at once can make a 512 MiB int64 copy).
    assert int(mapped.view(-1, 4096)[:, 0].sum()) == (64 << 20) // 4096
    resident_mapped, own_mapped = memory_now_mb()
    assert resident_mapped - resident > 50 and abs(own_mapped - own) < 20
    # Fresh anonymous pages: a heap allocation could reuse pages freed by earlier tests.
    anonymous = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    torch.frombuffer(anonymous, dtype=torch.uint8).fill_(1)
    resident_allocated, own_allocated = memory_now_mb()
    assert own_allocated - own_mapped > 50 and resident_allocated - resident_mapped > 50
    del mapped


@pytest.mark.needs_kernels
def test_a_file_renamed_over_the_model_in_use_leaves_it_alone(tmp_path, tmp_cache):
    """A download renamed over the model file during a chat: the chat's model keeps its
    weights (mapped from the packed cache, not the file); loading the path again gives
    the new model."""
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=16), qtype=QType.Q4_0)
    model = llama_chat.load(path, options_from_environment(), device="cpu")
    before = model.logits([3, 4, 5])
    replacement = write_gguf(tmp_path / "download.gguf", tiny_hf_model(seed=17), qtype=QType.Q4_0)
    os.replace(replacement, path)
    assert torch.equal(model.logits([3, 4, 5]), before)
    assert not torch.equal(llama_chat.load(path, options_from_environment(), device="cpu").logits([3, 4, 5]), before)


@pytest.mark.needs_kernels
def test_a_cache_that_cannot_be_written_is_one_line_and_the_model_runs(tmp_path, tmp_cache):
    tmp_cache.mkdir(parents=True)
    (tmp_cache / "packed").write_text("a file where the folder should be")
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=18), qtype=QType.Q4_0)
    model = llama_chat.load(path, options_from_environment(), device="cpu")
    assert "packed cache not written (" in model.weights.note and "\n" not in model.weights.note
    assert torch.isfinite(model.logits([3, 4, 5])).all()


@pytest.mark.needs_kernels
def test_tensor_parallel_ranks_map_one_entry_of_the_replicated_tensors(tmp_path, tmp_cache):
    """Two ranks of --tp 2: each its own entry of its split matrices, and one entry of the
    embedding, head and norms that both map."""
    from llama_chat.parallel.sharding import Shard

    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=19, intermediate_size=128), qtype=QType.Q4_0)
    ranks = [llama_chat.load(path, options_from_environment(), device="cpu", shard=Shard(rank, 2)) for rank in range(2)]
    written()
    assert len(entries(tmp_cache)) == 3
    again = [llama_chat.load(path, options_from_environment(), device="cpu", shard=Shard(rank, 2)) for rank in range(2)]
    assert len(entries(tmp_cache)) == 3
    sizes = {entry.stat().st_size for entry in entries(tmp_cache)}
    for first, second in zip(ranks, again):
        first_state, second_state = first.transformer.state_dict(), second.transformer.state_dict()
        assert all(torch.equal(first_state[name], second_state[name]) for name in first_state)
    tables = [model.transformer.tok_embeddings.table.blocks for model in again]
    shared = {table.untyped_storage().nbytes() for table in tables}
    assert len(shared) == 1 and shared <= sizes  # both views of the one replicated entry
    w13 = [model.transformer.layers[0].feed_forward.w13.blocks for model in again]
    assert not torch.equal(w13[0], w13[1])  # each rank its own rows
