"""The KV cache: every layer's keys and values for one sequence, and the token ids they hold.

A model call, eager or compiled, reads the cache through a `CacheCall`: each layer hands it
its new keys and values and attends over what it gives back. When the call ends, the cache
stores every layer's new keys and values at once (`write`); the cache alone knows its
layout and its position.

A windowed layer (Gemma's local layers) sees only the last `window` positions, so the
cache keeps its keys and values in a ring of window + TRIM_MARGIN slots, position p in
slot p % ring, whatever the conversation's length: its memory grows with the global
layers alone. Stored at the call's end, a ring's new entries replace slots only after
every token of the call has read them. The margin lets a verify step's refused drafts be
taken back exactly; for trims further back the cache keeps a few checkpoints of its rings
(`checkpoint`), and past those it forgets back to a point it can restore (so the caller
feeds the rest again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llama_chat.engine.config import ModelArgs
from llama_chat.errors import ContextOverflowError

TRIM_MARGIN = 32  # ring slots past the window: how many of the latest positions a trim takes back exactly
CHECKPOINTS = 4  # ring checkpoints kept at most (a reply's start and end, for the last two replies)
CHECKPOINT_BYTES = 256 << 20  # and in all at most this much, the newest kept first


def common_length(first: Sequence[int], second: Sequence[int]) -> int:
    """How many ids the two sequences begin with alike."""
    length = 0
    for a, b in zip(first, second):
        if a != b:
            break
        length += 1
    return length


def layer_sources(args: ModelArgs) -> list[tuple[bool, int]]:
    """For each layer: whether it is windowed, and its index among the cache's buffers of its
    kind (the global layers' or the windowed layers' rings)."""
    windowed = [args.is_windowed(layer) for layer in range(args.n_layers)]
    return [(kind, windowed[:layer].count(kind)) for layer, kind in enumerate(windowed)]


class CacheCall:
    """What one model call reads of a KV cache, and the new keys and values it hands back.

    A layer gives `update_and_fetch` its new keys and values [time, kv_heads, head_dim] and
    gets back its buffers of held keys and values [kv_heads, capacity (or ring), head_dim]
    and their bias: None for a global layer (its first `position` slots held, all visible),
    a windowed layer's window_bias [time, ring]. `new_entries` gives what the layers handed
    over, for KVCache.write. `position` is an int, or a symbolic one in an exported call.
    """

    def __init__(self, sources: list[tuple[bool, int]], position, held: Sequence[torch.Tensor]) -> None:
        self.sources = sources
        self.position = position
        # By kind (windowed or not): the bias of each layer's held positions, and its buffers.
        self._kinds = {False: (None, *held[:2])}
        if len(held) > 2:
            self._kinds[True] = tuple(held[2:])
        self._new_keys: list[torch.Tensor] = []
        self._new_values: list[torch.Tensor] = []

    def update_and_fetch(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        # Compact copies: a view would keep the layer's whole projection alive to the call's end.
        self._new_keys.append(keys.contiguous())
        self._new_values.append(values.contiguous())
        windowed, index = self.sources[layer]
        bias, held_keys, held_values = self._kinds[windowed]
        return held_keys[index], held_values[index], bias

    def new_entries(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer's new keys and values, [n_layers, time, kv_heads, head_dim] each."""
        return torch.stack(self._new_keys), torch.stack(self._new_values)


@dataclass
class _RingCheckpoint:
    """The rings as they were when the cache held `position` positions."""

    position: int
    ring_start: int
    keys: torch.Tensor
    values: torch.Tensor


class KVCache:
    """Keys and values of every layer for up to `capacity` positions of one sequence.

    `tokens` lists the ids whose keys and values fill positions [0, len(tokens)); it is
    the single record of what the cache holds, and so of its position. Trimming only
    shortens that list: the stale entries past it are overwritten by the next write. A
    model call reads the cache through `call` (or, compiled, `call_inputs`) and stores
    its keys and values at its end (`write`), so a call interrupted half-way leaves the
    cache as it was.
    """

    def __init__(
        self,
        args: ModelArgs,
        capacity: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if not 0 < capacity <= args.max_seq_len:
            raise ContextOverflowError(
                f"context size {capacity} is out of range: this model supports 1 to {args.max_seq_len} tokens"
            )
        self._sources = layer_sources(args)
        windowed = [kind for kind, _ in self._sources]
        self.global_layers, self.windowed_layers = windowed.count(False), windowed.count(True)
        # Which layers are of each kind, to take a compiled call's stacked keys apart.
        self._global_layers = torch.tensor([layer for layer, kind in enumerate(windowed) if not kind])
        self._windowed_layers = torch.tensor([layer for layer, kind in enumerate(windowed) if kind])
        self.window = args.sliding_window if any(windowed) else None
        self.ring = min(capacity, self.window + TRIM_MARGIN) if self.window else 0
        # Uninitialised: a position is read only after it is written, and untouched pages
        # cost no memory (zeros would commit the whole context up front: 1 GB for an 8 B
        # model's 4096 positions in float32).
        full = (windowed.count(False), args.n_kv_heads, capacity, args.head_dim)
        ring = (windowed.count(True), args.n_kv_heads, self.ring, args.head_dim)
        self._keys = torch.empty(full, device=device, dtype=dtype)
        self._values = torch.empty(full, device=device, dtype=dtype)
        # Zeros: every slot is read, an empty one under a bias of -inf, which must not meet a NaN.
        self._ring_keys = torch.zeros(ring, device=device, dtype=dtype)
        self._ring_values = torch.zeros(ring, device=device, dtype=dtype)
        self.capacity = capacity
        self._tokens: list[int] = []
        self._ring_start = 0  # the first position the rings still hold
        self._bias: tuple[int, int, torch.Tensor] | None = None  # this call's window bias, by position and length
        self._checkpoints: list[_RingCheckpoint] = []

    @property
    def tokens(self) -> list[int]:
        """The ids held, in order (a copy)."""
        return list(self._tokens)

    @property
    def position(self) -> int:
        """Where the next token goes: how many are held."""
        return len(self._tokens)

    def __len__(self) -> int:
        return self.position

    @property
    def dtype(self) -> torch.dtype:
        return self._keys.dtype

    def position_bytes(self) -> int:
        """Bytes one more position takes: keys and values of every global layer."""
        return 2 * self._keys[:, :, 0].numel() * self._keys.element_size()

    def ring_bytes(self) -> int:
        """Bytes of the windowed layers' rings, whatever the length (0 without windowed layers)."""
        return 2 * self._ring_keys.numel() * self._ring_keys.element_size()

    def window_bias(self, time: int) -> torch.Tensor:
        """The bias [time, ring] of each ring slot for each of `time` tokens fed next: 0 where
        the slot holds a position within that token's window, -inf elsewhere (float32)."""
        position = self.position
        if self._bias is not None and self._bias[:2] == (position, time):
            return self._bias[2]
        slots = torch.arange(self.ring)
        held = self._ring_start + (slots - self._ring_start) % self.ring  # the position each slot holds
        first_seen = position + torch.arange(time)[:, None] - self.window + 1
        visible = (held[None, :] < position) & (held[None, :] >= first_seen)
        bias = torch.zeros(visible.shape).masked_fill_(~visible, float("-inf")).to(self._keys.device)
        self._bias = (position, time, bias)
        return bias

    def call(self, time: int) -> CacheCall:
        """The cache as a model call of `time` tokens reads it (see CacheCall)."""
        self._check_fits(time)
        return CacheCall(self._sources, self.position, self._held(time))

    def call_inputs(self, time: int) -> list[torch.Tensor]:
        """What a compiled model call of `time` tokens reads of the cache, as tensors (a
        package takes nothing else): the position, a 0-d int64 tensor, then what CacheCall
        takes as held. The call gives its new keys and values back for `write`."""
        self._check_fits(time)
        return [torch.tensor(self.position), *self._held(time)]

    def _held(self, time: int) -> list[torch.Tensor]:
        """The global layers' keys and values [layers, kv_heads, capacity, head_dim], then
        (with windowed layers) window_bias and the rings' [layers, kv_heads, ring, head_dim]."""
        held = [self._keys, self._values]
        if self.window is not None:
            held += [self.window_bias(time), self._ring_keys, self._ring_values]
        return held

    def _check_fits(self, time: int) -> None:
        if self.position + time > self.capacity:
            raise ContextOverflowError(f"the context of {self.capacity} tokens is full")

    def write(self, ids: Sequence[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store the keys and values [n_layers, len(ids), kv_heads, head_dim] of ids (as
        CacheCall.new_entries gives them) at the next positions, every layer at once."""
        self._check_fits(len(ids))
        start, end = self.position, self.position + len(ids)
        keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # the buffers' [layers, kv_heads, time, head_dim]
        if self.window is None:
            self._keys[:, :, start:end] = keys
            self._values[:, :, start:end] = values
        else:  # one write a kind of layer and tensor
            self._keys[:, :, start:end] = keys[self._global_layers]
            self._values[:, :, start:end] = values[self._global_layers]
            self._store_in_rings(keys[self._windowed_layers], values[self._windowed_layers])
        self._extend(ids)

    def _store_in_rings(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The windowed layers' keys and values [layers, kv_heads, time, head_dim] of the next
        positions into their rings: the last `ring` of them, each in its slot."""
        start, time = self.position, keys.shape[2]
        kept = min(time, self.ring)
        slots = torch.arange(start + time - kept, start + time, device=keys.device) % self.ring
        self._ring_keys.index_copy_(2, slots, keys[:, :, time - kept :].to(self.dtype))
        self._ring_values.index_copy_(2, slots, values[:, :, time - kept :].to(self.dtype))

    def _extend(self, ids: Sequence[int]) -> None:
        self._tokens.extend(ids)
        if self.window is not None:
            self._ring_start = max(self._ring_start, self.position - self.ring)
        self._bias = None

    def state(self, length: int | None = None) -> dict[str, torch.Tensor]:
        """The first `length` positions (all by default) as tensors to save: keys and values
        [global layers, kv_heads, length, head_dim], the windowed layers' last window - 1
        of them in order ("window_keys", "window_values"), and their token ids. A windowed
        cache saves only lengths it holds exactly (see exact_length)."""
        length = self.position if length is None else length
        state = {
            "keys": self._keys[:, :, :length].contiguous(),
            "values": self._values[:, :, :length].contiguous(),
            "tokens": torch.tensor(self._tokens[:length], dtype=torch.int64),
        }
        if self.window is not None:
            if self.exact_length(length) != length:
                raise ValueError(f"the windowed layers no longer hold what position {length} needs")
            slots = torch.arange(length - self._window_held(length), length) % self.ring
            state["window_keys"] = self._ring_keys[:, :, slots].contiguous()
            state["window_values"] = self._ring_values[:, :, slots].contiguous()
        return state

    def state_shapes(self, length: int) -> dict[str, list[int]]:
        """The shapes of state()'s keys and values for `length` positions, by name."""
        layers, kv_heads, _, head_dim = self._keys.shape
        shapes = {"keys": [layers, kv_heads, length, head_dim], "values": [layers, kv_heads, length, head_dim]}
        if self.window is not None:
            windowed = [len(self._ring_keys), kv_heads, self._window_held(length), head_dim]
            shapes.update(window_keys=windowed, window_values=windowed)
        return shapes

    def _window_held(self, length: int) -> int:
        """How many positions before `length` a windowed layer's next token reads."""
        return min(length, self.window - 1)

    def load_state(self, ids: Sequence[int], state: dict[str, torch.Tensor]) -> None:
        """Hold exactly ids, with their keys and values as state() gives them (rounded to this
        cache's dtype)."""
        self.trim(0)
        length = len(ids)
        if length > self.capacity:
            raise ContextOverflowError(f"the context of {self.capacity} tokens is full")
        self._keys[:, :, :length] = state["keys"]
        self._values[:, :, :length] = state["values"]
        if self.window is not None:
            held = self._window_held(length)
            slots = torch.arange(length - held, length) % self.ring
            self._ring_keys[:, :, slots] = state["window_keys"].to(self.dtype)
            self._ring_values[:, :, slots] = state["window_values"].to(self.dtype)
            self._ring_start = length - held
        self._tokens = list(ids)
        self._bias = None

    def exact_length(self, length: int) -> int:
        """The most positions up to `length` (at most those held) that the cache holds exactly
        as they stand, without a checkpoint: for a windowed cache, those whose window the
        rings still hold; 0 when none but the start."""
        length = min(length, self.position)
        if self.window is None or length - self._window_held(length) >= self._ring_start:
            return length
        return 0

    def checkpoint(self) -> None:
        """Remember the rings as they are now, so that a later trim back to here (or a little
        before) is exact; a cache without windowed layers needs none."""
        if self.window is None or self._checkpoints and self._checkpoints[-1].position == self.position:
            return
        self._checkpoints.append(_RingCheckpoint(self.position, self._ring_start, self._ring_keys.clone(),
                                                 self._ring_values.clone()))
        kept, total = [], 0
        for checkpoint in reversed(self._checkpoints):  # the newest first, within both bounds
            total += 2 * checkpoint.keys.numel() * checkpoint.keys.element_size()
            if kept and (len(kept) == CHECKPOINTS or total > CHECKPOINT_BYTES):
                break
            kept.append(checkpoint)
        self._checkpoints = kept[::-1]

    def trim(self, length: int) -> int:
        """Forget every position from `length` on, without copying anything: how a rejected
        draft, a retried reply or a changed prompt is taken back. A windowed cache takes back
        exactly the last TRIM_MARGIN positions, and further back only to its checkpoints:
        it keeps the most positions up to `length` it can restore, perhaps fewer (0 at
        worst). Returns how many it keeps."""
        if not 0 <= length <= self.position:
            raise ValueError(f"cannot trim a cache of {self.position} tokens to {length}")
        if self.window is not None and length < self.position:
            length = self._restore_rings(length)
        del self._tokens[length:]
        self._checkpoints = [c for c in self._checkpoints if c.position <= length]
        self._bias = None
        return length

    def _restore_rings(self, length: int) -> int:
        """Bring the rings to a state that holds `length` positions exactly, and return
        `length`; or, where none does, the latest checkpoint before it (or the start)."""
        if length - self._window_held(length) >= self._ring_start:
            return length
        usable = [c for c in self._checkpoints if c.position >= length and length - self._window_held(length)
                  >= c.ring_start]
        earlier = [c for c in self._checkpoints if c.position < length]
        if usable:
            checkpoint = usable[0]
        elif earlier:
            checkpoint, length = earlier[-1], earlier[-1].position
        else:
            self._ring_start = 0
            return 0
        self._ring_keys.copy_(checkpoint.keys)
        self._ring_values.copy_(checkpoint.values)
        self._ring_start = checkpoint.ring_start
        return length

    def max_rollback(self) -> int | None:
        """How many positions a call may add that a trim then takes back exactly, whatever came
        before (None: any number): a verify step's drafts are held to it."""
        return None if self.window is None else TRIM_MARGIN + 1

    def keep_common_prefix(self, ids: Sequence[int], at_most: int | None = None) -> int:
        """Keep the cached positions that start `ids` (at most `at_most` of them), forget the
        rest, and return how many were kept: the tokens a new prompt need not feed again."""
        kept = self.common_prefix(ids)
        if at_most is not None:
            kept = min(kept, at_most)
        return self.trim(kept)

    def common_prefix(self, ids: Sequence[int]) -> int:
        """How many cached positions start `ids`."""
        return common_length(self._tokens, ids)

    def remaining(self) -> int:
        """How many more positions fit."""
        return self.capacity - self.position

    def check_fits(self, count: int) -> None:
        """Refuse, with one line, `count` more tokens that do not fit."""
        if count > self.remaining():
            raise ContextOverflowError(
                f"{count} more tokens do not fit: the context holds {self.capacity} and {len(self)} are used"
            )
