"""The packed cache as a whole (kernels/packed_cache_entries.py and `llama-chat cache`):
pruned by last use to its bound, listed, cleared."""

import os
import shutil
import time
from collections import namedtuple

import pytest
import torch
from gguf import GGMLQuantizationType as QType

import llama_chat
from llama_chat.cli import main
from llama_chat.cli.options import configure_folders
from llama_chat.environment import PACKED_CACHE_GB, kernel_options
from llama_chat.errors import LlamaChatError
from llama_chat.kernels import packed_cache
from llama_chat.kernels.packed_cache_entries import bound_bytes, entries, make_room

from .loading_helpers import options_from_environment
from .test_gguf import tiny_hf_model, write_gguf
from .test_packed_cache import write_entry, written

MB = 1_000_000
DiskUsage = namedtuple("DiskUsage", "total used free")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CHAT_CACHE", str(tmp_path / "cache"))
    configure_folders()
    return tmp_path / "cache" / "packed"


def configured_bound() -> str | None:
    """The bound the command line reads from the environment."""
    return kernel_options().packed_cache_gb


def entry_used(folder, name: str, megabytes: int, hours_ago: float):
    """An entry of `megabytes` last used `hours_ago`."""
    path = folder / f"{name}.safetensors"
    write_entry(path, {"w": torch.zeros(megabytes * MB, dtype=torch.uint8)})
    used = time.time() - hours_ago * 3600
    os.utime(path, (used, used))
    return path


def test_the_least_recently_used_entries_go_first_until_the_new_one_fits(folder, monkeypatch):
    monkeypatch.setenv(PACKED_CACHE_GB, "0.010")  # 10 MB
    oldest = entry_used(folder, "oldest", 3, hours_ago=30)
    in_use = entry_used(folder, "in-use", 3, hours_ago=20)  # the load under way maps it: kept
    older = entry_used(folder, "older", 3, hours_ago=10)
    recent = entry_used(folder, "recent", 3, hours_ago=1)
    removed = make_room(folder, 2 * MB, keep={in_use}, bound_gb=configured_bound())
    assert [entry.path for entry in removed] == [oldest, older]
    assert sorted(entry.path for entry in entries(folder)) == sorted([in_use, recent])
    assert make_room(folder, 0, keep=set(), bound_gb=configured_bound()) == []  # within the bound: nothing goes


def test_entries_in_use_are_kept_even_past_the_bound(folder, monkeypatch):
    monkeypatch.setenv(PACKED_CACHE_GB, "0")
    kept = entry_used(folder, "big", 2, hours_ago=5)
    other = entry_used(folder, "other", 1, hours_ago=1)
    assert [entry.path for entry in make_room(folder, MB, keep={kept}, bound_gb=configured_bound())] == [other]
    assert kept.exists()


def test_unfinished_writes_are_removed_only_when_a_day_old(folder, monkeypatch):
    monkeypatch.setenv(PACKED_CACHE_GB, "20")
    folder.mkdir(parents=True)
    stale, fresh = folder / ".a.safetensors.x1.partial", folder / ".b.safetensors.x2.partial"
    for path, hours in ((stale, 25), (fresh, 1)):
        path.write_bytes(b"half")
        os.utime(path, (time.time() - hours * 3600,) * 2)
    assert [entry.path for entry in make_room(folder, 0, keep=set(), bound_gb=configured_bound())] == [stale]
    assert fresh.exists()


def test_the_bound_is_the_setting_or_half_the_room_the_cache_could_have(folder, monkeypatch):
    folder.mkdir(parents=True)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: DiskUsage(10**12, 0, 100 * 10**9))
    monkeypatch.delenv(PACKED_CACHE_GB, raising=False)
    assert bound_bytes(folder, held=0, configured_gb=configured_bound()) == 20 * 10**9  # the default: 20 GB
    monkeypatch.setenv(PACKED_CACHE_GB, "2.5")
    assert bound_bytes(folder, held=0, configured_gb=configured_bound()) == 2.5 * 10**9
    monkeypatch.setenv(PACKED_CACHE_GB, "500")
    # half of 100 GB free and the 10 held
    assert bound_bytes(folder, held=10 * 10**9, configured_gb=configured_bound()) == 55 * 10**9
    for bad in ("lots", "-1", "inf", "nan"):
        monkeypatch.setenv(PACKED_CACHE_GB, bad)
        with pytest.raises(LlamaChatError, match=f"{PACKED_CACHE_GB}='{bad}'"):
            bound_bytes(folder, held=0, configured_gb=configured_bound())


def test_mapping_an_entry_records_its_use(folder):
    path = entry_used(folder, "entry", 1, hours_ago=48)
    before = folder / "before"
    before.touch()  # the file system's time as the load starts
    packed_cache.load_entry(path)
    assert path.stat().st_mtime_ns >= before.stat().st_mtime_ns


@pytest.mark.needs_kernels
def test_a_first_load_makes_room_by_last_use_and_names_its_model_file(tmp_path, folder, monkeypatch, capsys):
    monkeypatch.setenv(PACKED_CACHE_GB, "0.001")  # 1 MB: the stale entry and the new one do not fit
    stale = entry_used(folder, "stale", 2, hours_ago=3)
    path = write_gguf(tmp_path / "model.gguf", tiny_hf_model(seed=30), qtype=QType.Q4_0)
    llama_chat.load(path, options_from_environment(), device="cpu")
    assert not stale.exists()  # room made at load, before the write behind it
    written()
    assert main(["cache"]) == 0
    listing = capsys.readouterr().out
    assert "model.gguf" in listing and "stale" not in listing


def test_the_cache_command_lists_every_entry_and_survives_bad_ones(folder, monkeypatch, capsys):
    monkeypatch.setenv(PACKED_CACHE_GB, "20")
    entry_used(folder, "unnamed", 1, hours_ago=1)  # written without the model file's name
    write_entry(folder / "named.safetensors", {"w": torch.zeros(2 * MB, dtype=torch.uint8)}, "llama\x1b[31m.gguf")
    (folder / "garbage.safetensors").write_bytes(b"\xff" * 100)
    (folder / ".named.safetensors.x.partial").write_bytes(b"half")
    (folder / "notes.txt").write_text("not an entry")
    assert main(["cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"packed weights in {folder}: 3.0 MB of at most 20.00 GB")
    assert lines[1].split() == ["last", "used", "size", "model", "file"]
    rows = lines[2:]
    assert len(rows) == 4 and not any("notes" in row for row in rows)
    assert any(row.endswith(r"2.0 MB  llama\x1b[31m.gguf") for row in rows)  # escaped, never obeyed
    assert any(row.endswith("(unreadable)") for row in rows)
    assert any(row.endswith("(a write not finished)") for row in rows)
    assert any(row.endswith("1.0 MB  (not recorded)") for row in rows)


def test_cache_clear_removes_every_entry(folder, capsys):
    entry_used(folder, "one", 1, hours_ago=2)
    entry_used(folder, "two", 2, hours_ago=1)
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == "removed 2 packed entries, 3.0 MB\n"
    assert entries(folder) == []
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == "removed 0 packed entries, 0.0 MB\n"


def test_the_cache_command_with_the_cache_off(monkeypatch, capsys):
    monkeypatch.setenv("LLAMA_CHAT_CACHE", "off")
    assert main(["cache"]) == 0
    assert "the cache is off" in capsys.readouterr().out
