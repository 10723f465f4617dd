"""GGUF's 4-bit block types as levels, scales and zeros, without a float copy of the weights.

Q4_0, Q4_1 and Q4_K all store 4-bit levels in groups of 32 with one scale and one
offset per group, which is exactly what the int4 kernel format holds: their rows
become Int4Groups bit for bit (bar the scales' own dtype). Layouts as ggml defines them:
- Q4_0: 18 bytes per 32 weights: float16 d, then 16 bytes of levels; w = (q - 8) d.
- Q4_1: 20 bytes: float16 d and m, then 16 bytes; w = q d + m.
- Q4_K: 144 bytes per 256 weights: float16 d and dmin, 12 bytes of 6-bit scales and
  minimums for 8 groups, 128 bytes of levels; w = q d sc - dmin mn per group.
In each 32-byte run of levels, the low nibbles are one group and the high nibbles the next
(Q4_K), or the low nibbles are a block's first 16 weights and the high ones its last 16.
"""

from __future__ import annotations

import numpy as np
import torch

from llama_chat.checkpoints.stored import Int4Groups

FOUR_BIT_TYPES = ("Q4_0", "Q4_1", "Q4_K")
# Types llama-chat's own kernels read as the file stores them (kernels/block_linear).
KERNEL_BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def _float16(raw: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block, as float32 [blocks]."""
    return raw[:, start : start + 2].copy().view(np.float16)[:, 0].astype(np.float32)


def _low_then_high(packed: np.ndarray) -> np.ndarray:
    """[blocks, 16] bytes to [blocks, 32] levels: the 16 low nibbles, then the 16 high ones."""
    levels = np.empty((packed.shape[0], 32), dtype=np.uint8)
    np.bitwise_and(packed, 15, out=levels[:, :16])
    np.right_shift(packed, 4, out=levels[:, 16:])
    return levels


def _q4_0(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _float16(raw, 0)
    return _low_then_high(raw[:, 2:18]), d, np.zeros_like(d)


def _q4_1(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, m = _float16(raw, 0), _float16(raw, 2)
    return _low_then_high(raw[:, 4:20]), d, m + 8 * d


def _q4_k(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = _float16(raw, 0)[:, None], _float16(raw, 2)[:, None]
    packed_scales = raw[:, 4:16].astype(np.uint8)
    low, high = packed_scales[:, 0:4], packed_scales[:, 4:8]
    tail = packed_scales[:, 8:12]
    # Groups 0-3 keep 6 bits in bytes 0-3 (scales) and 4-7 (minimums); groups 4-7 take
    # their low 4 bits from bytes 8-11 and their top 2 bits from the top of bytes 0-7.
    scale = np.concatenate([low & 63, (tail & 15) | ((low >> 6) << 4)], axis=1).astype(np.float32)
    minimum = np.concatenate([high & 63, (tail >> 4) | ((high >> 6) << 4)], axis=1).astype(np.float32)
    levels = raw[:, 16:144].reshape(-1, 4, 32)
    levels = np.stack([levels & 15, levels >> 4], axis=2).reshape(-1, 8 * 32)  # group by group
    scales = d * scale
    return levels, scales.reshape(-1), (8 * scales - dmin * minimum).reshape(-1)


_DECODERS = {"Q4_0": (_q4_0, 18, 32), "Q4_1": (_q4_1, 20, 32), "Q4_K": (_q4_k, 144, 256)}


def int4_groups(raw_rows: np.ndarray, type_name: str, columns: int) -> Int4Groups:
    """Rows of a 4-bit GGUF tensor (raw bytes [rows, bytes per row]) as Int4Groups."""
    decode, block_bytes, block_weights = _DECODERS[type_name]
    rows = raw_rows.shape[0]
    blocks = np.ascontiguousarray(raw_rows).reshape(-1, block_bytes)
    levels, scales, zeros = decode(blocks)
    assert levels.size == rows * columns and block_weights * blocks.shape[0] == levels.size
    return Int4Groups(
        torch.from_numpy(np.ascontiguousarray(levels, dtype=np.uint8)).view(rows, columns),
        torch.from_numpy(np.ascontiguousarray(scales, dtype=np.float32)).view(rows, -1),
        torch.from_numpy(np.ascontiguousarray(zeros, dtype=np.float32)).view(rows, -1),
    )
