"""The probe's timings: each keyed by what it timed (a `Timing`), and kept in the cache
folder per machine and probe, so that a CPU is measured once.

On disk, cpu-paths.json is a table of readable entries, one per machine and probe, each a
list of records: {"path": "kernel", "rows": 16, "seconds": 0.0012} (and "dtype" where the
path ran in one). An entry of another form, from an older llama-chat, is measured again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from llama_chat.untrusted_files import parse_json
from llama_chat.disk_cache import entry_path, read_checked, staged
from llama_chat.engine.device import cpu_model_name
from llama_chat.kernels.weights_record import dtype_name
from llama_chat.options import DTYPES

PROBE_FILE = "cpu-paths.json"


class Timing(NamedTuple):
    """One call the probe timed: the path that ran it (a kind of step on PyTorch's kernels,
    or a variant of llama-chat's), on how many rows, in which dtype (None: not one, or
    the faster of several)."""

    path: str
    rows: int
    dtype: torch.dtype | None = None

    def record(self, seconds: float) -> dict:
        fields = {"path": self.path, "rows": self.rows, "seconds": seconds}
        return fields if self.dtype is None else {**fields, "dtype": dtype_name(self.dtype)}


class Probe(NamedTuple):
    """What a probe measured, beyond the machine: its kind, the packing or build it ran,
    the layer's widths, and the choices it was measured under (dtypes, variants)."""

    kind: str
    packing: str
    widths: tuple[int, int]
    under: tuple[str, ...] = ()

    def label(self) -> str:
        machine = [cpu_model_name(), torch.backends.cpu.get_cpu_capability(), torch.__version__]
        return " | ".join([*machine, self.kind, self.packing, "x".join(map(str, self.widths)), *self.under])


def _timings(records: object) -> dict[Timing, float] | None:
    """An entry's records as timings; None for an entry of another form."""
    if not isinstance(records, list):
        return None
    times = {}
    for record in records:
        if not isinstance(record, dict) or not isinstance(record.get("seconds"), float):
            return None
        dtype = DTYPES.get(record.get("dtype", ""))
        if not isinstance(record.get("path"), str) or not isinstance(record.get("rows"), int) or (
            "dtype" in record and dtype is None
        ):
            return None
        times[Timing(record["path"], record["rows"], dtype)] = record["seconds"]
    return times


def _read_table(path: Path) -> dict:
    known = parse_json(path.read_bytes())  # nesting bounded: a deep file would end in RecursionError
    if not isinstance(known, dict):
        raise ValueError("not a table of measurements")
    return known


def remembered(
    probe: Probe, measure: Callable[[], dict[Timing, float]], timed: frozenset[Timing]
) -> dict[Timing, float]:
    """measure() (these timings), kept in the cache folder per machine and probe. A file that
    does not read back is replaced, with one line on stderr."""
    path = entry_path(PROBE_FILE)
    known: dict = {}
    if path is not None and path.exists():
        table, damage = read_checked([path], lambda: _read_table(path))
        if damage:
            print(f"llama-chat: {path} did not read back ({damage}); measuring again", file=sys.stderr)
        known = table or {}
    kept = _timings(known.get(probe.label()))
    if kept is not None and set(kept) == timed:
        return kept
    times = measure()
    if path is not None:
        readable = {label: entry for label, entry in known.items() if _timings(entry) is not None}
        readable[probe.label()] = [timing.record(seconds) for timing, seconds in times.items()]
        try:
            with staged(path) as staging:
                staging.write_text(json.dumps(readable, indent=1), encoding="utf-8")
        except OSError:
            pass  # an unwritable cache only means measuring again next time
    return times
