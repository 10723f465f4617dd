"""Split GGUF models (llama.cpp's gguf-split: NAME-00001-of-00003.gguf, ...): read from their
parts as the one file they were split from, the packed cache keyed by every part, and every
way the parts can fail to be one model refused in one line."""

import functools
import os
import struct
from pathlib import Path

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat.checkpoints.detect import read_checkpoint
from llama_chat.checkpoints.gguf_tensors import GGUFMatrix
from llama_chat.errors import LlamaChatError
from llama_chat.kernels import packed_cache
from llama_chat.kernels.packed_cache_writer import finish_writes
from llama_chat.model_info import model_info

from .loading_helpers import options_from_environment
from .test_gguf import IDS, tiny_hf_model, write_gguf

PER_PART = 8  # tensors: the tiny model's 21 make three parts


def write_split(folder: Path, model, qtype: QType = QType.F32) -> list[Path]:
    """The model as write_gguf writes it, split as gguf-split splits (the gguf package's
    writer, told to start a new part every PER_PART tensors): the parts, first to last."""
    folder.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFWriter", functools.partial(gguf.GGUFWriter, split_max_tensors=PER_PART))
        write_gguf(folder / "model.gguf", model, qtype=qtype)
    parts = sorted(folder.glob("model-*-of-*.gguf"))
    assert [p.name for p in parts] == [f"model-0000{n}-of-00003.gguf" for n in (1, 2, 3)]
    return parts


def set_split_value(path: Path, key: str, value: int) -> None:
    """Rewrite one split.* value of a part in place (u16, or i32 for split.tensors.count)."""
    data = bytearray(path.read_bytes())
    name = struct.pack("<Q", len(key)) + key.encode()
    at = data.index(name) + len(name)
    (value_type,) = struct.unpack_from("<I", data, at)
    struct.pack_into({2: "<H", 5: "<i"}[value_type], data, at + 4, value)
    path.write_bytes(data)


def refusal(path: Path) -> str:
    """The one line reading the model named `path` is refused with."""
    with pytest.raises(LlamaChatError) as error:
        read_checkpoint(path)
    message = str(error.value)
    assert "\n" not in message
    return message


# --- read as the one file --------------------------------------------------------------


def test_the_parts_read_as_the_one_file_each_tensor_where_it_lies(tmp_path):
    model = tiny_hf_model(seed=1)
    single = read_checkpoint(write_gguf(tmp_path / "single.gguf", model, qtype=QType.Q8_0))
    parts = write_split(tmp_path / "split", model, qtype=QType.Q8_0)
    split = read_checkpoint(parts[0])
    assert split.args == single.args and split.source_quantization == single.source_quantization == "Q8_0"
    expected, got = single.state_dict(), split.state_dict()
    assert set(got) == set(expected) and all(torch.equal(got[name], expected[name]) for name in expected)
    # Matrices are read from the part they lie in, at its offsets: nothing is copied out of the parts.
    files = {weight.tensor.file for weight in split.tensors.values() if isinstance(weight, GGUFMatrix)}
    assert files == set(parts)


@pytest.mark.needs_kernels
@pytest.mark.parametrize("qtype", [QType.F32, QType.Q8_0, QType.Q4_0])
def test_a_split_model_gives_the_single_files_logits_on_our_kernels(tmp_path, qtype):
    model = tiny_hf_model(seed=2)
    single = write_gguf(tmp_path / "single.gguf", model, qtype=qtype)
    parts = write_split(tmp_path / "split", model, qtype=qtype)
    expected = llama_chat.load(single, options_from_environment(), device="cpu").logits(IDS)
    assert torch.equal(llama_chat.load(parts[0], options_from_environment(), device="cpu").logits(IDS), expected)
    # Again, mapped from the packed cache the first load wrote.
    assert torch.equal(llama_chat.load(parts[0], options_from_environment(), device="cpu").logits(IDS), expected)


def test_info_shows_the_totals_and_the_parts(tmp_path):
    model = tiny_hf_model(seed=3)
    single = dict(model_info(write_gguf(tmp_path / "single.gguf", model, qtype=QType.Q4_0)))
    parts = write_split(tmp_path / "split", model, qtype=QType.Q4_0)
    rows = dict(model_info(parts[0]))
    megabytes = sum(p.stat().st_size for p in parts) / 1e6
    assert rows["file"] == f"{parts[0]} ({megabytes:.1f} MB, split in 3 parts)"
    for label in ("parameters", "layers", "vocabulary", "tensor types", "kernels"):
        assert rows[label] == single[label], label


# --- the packed cache's key -------------------------------------------------------------


def test_the_packed_cache_key_covers_every_part(tmp_path):
    parts = write_split(tmp_path / "split", tiny_hf_model(seed=4), qtype=QType.Q8_0)
    identity = packed_cache.source_identity(parts[0])
    assert [file[0] for file in identity] == [p.name for p in parts]
    key = packed_cache.packed_entry(parts[0], {})
    other = write_split(tmp_path / "other", tiny_hf_model(seed=5), qtype=QType.Q8_0)
    os.replace(other[2], parts[2])  # the same size, other weights
    assert packed_cache.source_identity(parts[0])[:2] == identity[:2]
    assert packed_cache.packed_entry(parts[0], {}) != key


@pytest.mark.needs_kernels
def test_replacing_a_later_part_packs_the_model_again(tmp_path):
    parts = write_split(tmp_path / "split", tiny_hf_model(seed=6), qtype=QType.Q4_0)
    before = llama_chat.load(parts[0], options_from_environment(), device="cpu").logits(IDS)
    other = write_split(tmp_path / "other", tiny_hf_model(seed=7), qtype=QType.Q4_0)
    os.replace(other[2], parts[2])
    after = llama_chat.load(parts[0], options_from_environment(), device="cpu").logits(IDS)
    assert not torch.equal(before, after)
    assert finish_writes() == []  # the entries are written behind the loads
    assert len(list((Path(os.environ["LLAMA_CHAT_CACHE"]) / "packed").glob("*.safetensors"))) == 2


# --- parts that are not one model ---------------------------------------------------------


@pytest.fixture
def parts(tmp_path) -> list[Path]:
    return write_split(tmp_path / "split", tiny_hf_model(seed=8))


def test_a_missing_part_is_named(parts):
    parts[1].unlink()
    message = refusal(parts[0])
    assert message.startswith(f"{parts[0]}: part 2 of 3, model-00002-of-00003.gguf, is missing")
    assert "all parts of a split model must sit together in one folder" in message


def test_a_later_part_named_says_to_name_the_first(parts):
    assert refusal(parts[1]) == (
        f"{parts[1]} is part 2 of 3 of a split model; name its first part, model-00001-of-00003.gguf"
    )


def test_a_first_part_without_the_split_name_is_refused(parts):
    renamed = parts[0].with_name("model.gguf")
    os.replace(parts[0], renamed)
    assert "its name does not end -00001-of-00003.gguf, so the others cannot be found" in refusal(renamed)


def test_a_part_claiming_65535_parts(parts):
    set_split_value(parts[2], "split.count", 65535)
    assert refusal(parts[0]).startswith(f"{parts[2]} says the model is split in 65535 parts, where")


def test_a_first_part_claiming_65535_parts_is_not_named_as_their_first(parts):
    set_split_value(parts[0], "split.count", 65535)
    assert "its name does not end -00001-of-65535.gguf" in refusal(parts[0])


def test_a_first_part_claiming_65535_parts_stops_at_the_first_missing_one(parts):
    for number, part in enumerate(parts, 1):
        set_split_value(part, "split.count", 65535)
        os.replace(part, part.with_name(f"model-{number:05d}-of-65535.gguf"))
    first = parts[0].with_name("model-00001-of-65535.gguf")
    assert "part 4 of 65535, model-00004-of-65535.gguf, is missing" in refusal(first)


def test_a_part_whose_number_is_not_its_names(parts):
    set_split_value(parts[1], "split.no", 2)
    assert refusal(parts[0]).startswith(f"{parts[1]} says it is part 3, where its name says part 2")


def test_parts_swapped(parts):
    os.replace(parts[1], parts[0].with_name("swap"))
    os.replace(parts[2], parts[1])
    os.replace(parts[0].with_name("swap"), parts[2])
    assert "says it is part 3, where its name says part 2" in refusal(parts[0])


def test_a_part_that_is_a_link_to_the_first(parts):
    parts[1].unlink()
    parts[1].symlink_to(parts[0].name)
    assert refusal(parts[0]) == (
        f"{parts[1]} is the same file as model-00001-of-00003.gguf; each part of a split model is a file "
        "of its own (download the parts again)"
    )


def test_a_part_that_is_a_hard_link_to_another(parts):
    parts[2].unlink()
    os.link(parts[1], parts[2])
    assert "is the same file as model-00002-of-00003.gguf" in refusal(parts[0])


def test_parts_that_link_to_each_other_in_a_loop(parts):
    for part, target in ((parts[1], parts[2]), (parts[2], parts[1])):
        part.unlink()
        part.symlink_to(target.name)
    assert refusal(parts[0]).startswith(f"{parts[1]}: cannot read it (")


def test_a_tensor_in_two_parts(parts):
    parts[2].write_bytes(parts[1].read_bytes())
    set_split_value(parts[2], "split.no", 2)
    message = refusal(parts[0])
    assert message.startswith(f"{parts[2]}: tensor ") and "is in model-00002-of-00003.gguf too" in message


def test_a_total_that_is_not_the_parts(parts):
    set_split_value(parts[0], "split.tensors.count", 20)
    assert "its 3 parts hold 21 tensors, where split.tensors.count says 20" in refusal(parts[0])


def test_a_part_that_is_not_a_gguf(parts):
    parts[1].write_text("not a model")
    assert refusal(parts[0]) == f"{parts[1]} is not a GGUF file (it does not start with 'GGUF')"


def test_a_part_that_is_a_folder(parts):
    parts[1].unlink()
    parts[1].mkdir()
    assert refusal(parts[0]).startswith(f"{parts[1]}: cannot read it (")


def test_a_bad_split_value_is_named(parts):
    set_split_value(parts[0], "split.count", 0)
    assert "split.count is 0, where a whole number from 1 to 65535 belongs" in refusal(parts[0])
