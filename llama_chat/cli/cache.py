"""`llama-chat cache [clear]`: the packed weights kept on disk (model file, size, last use),
or all of them removed."""

from __future__ import annotations

import argparse
import time

from llama_chat.chat.display import visible
from llama_chat.environment import PACKED_CACHE_GB, kernel_options
from llama_chat.kernels import packed_cache
from llama_chat.kernels.packed_cache_entries import bound_bytes, entries
from llama_chat.paths import cache_root


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llama-chat cache", description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", choices=["list", "clear"], default="list",
                        help="list the entries (the default), or remove them all")
    options = parser.parse_args(argv)
    root = cache_root()
    if root is None:
        print("the cache is off (LLAMA_CHAT_CACHE=off): no packed weights are kept")
        return 0
    folder = root / "packed"
    found = entries(folder)
    if options.action == "clear":
        for entry in found:
            entry.path.unlink(missing_ok=True)
        noun = "entry" if len(found) == 1 else "entries"
        print(f"removed {len(found)} packed {noun}, {gigabytes(sum(entry.size for entry in found))}")
        return 0
    held = sum(entry.size for entry in found)
    bound = bound_bytes(folder, held, kernel_options().packed_cache_gb)
    print(f"packed weights in {folder}: {gigabytes(held)} of at most {gigabytes(bound)} "
          f"(the least recently used go first; {PACKED_CACHE_GB} sets the bound)")
    if found:
        print(f"{'last used':17}  {'size':>9}  model file")
    for entry in reversed(found):  # the most recently used first
        if entry.unfinished:
            name = "(a write not finished)"
        else:
            source = packed_cache.source_of(entry.path)
            name = "(unreadable)" if source is None else visible(source) or "(not recorded)"
        print(f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(entry.last_used)):17}  "
              f"{gigabytes(entry.size):>9}  {name}")
    return 0


def gigabytes(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"
