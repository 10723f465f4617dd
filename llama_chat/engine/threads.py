"""The threads this process's work may use.

A ThreadGovernor (engine/runners.py) lowers PyTorch's thread count while another process
or a child of the chat takes a core, and leaves it lowered between calls. What it lowered
is not what a model loaded later (a /load, the move onto llama-chat's kernels), its
governor or its packing should size themselves by: they ask `process_threads()`."""

from __future__ import annotations

import torch

_process_threads: int | None = None  # PyTorch's count before a governor first changed it


def process_threads() -> int:
    """The threads this process was given (PyTorch's count as the process set it)."""
    return _process_threads or torch.get_num_threads()


def run_with(threads: int) -> None:
    """Run PyTorch's next calls on `threads`, the process's own count remembered first."""
    global _process_threads
    if _process_threads is None:
        _process_threads = torch.get_num_threads()
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
