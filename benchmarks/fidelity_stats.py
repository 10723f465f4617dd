"""Teacher-forced fidelity figures in numpy alone, shared by fidelity.py and llama.cpp's side
(llama_cpp_fidelity.py, which runs under another interpreter, without torch).

The reference's logits [positions, vocabulary] lie in a raw float32 file that each side
reads a block of positions at a time, as it compares that block's logits: no more than a
block of any kind's logits is held at once, whatever the vocabulary (a whole matrix of
2,048 positions of Gemma 3's 262,144 tokens would be 2 GB).
"""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np

BLOCK = 64  # positions whose logits are held at once, of each kind
ROWS_AT_ONCE = 8  # rows widened to float64 together: 8 x 262,144 x 8 bytes = 16 MB a temporary


def block_for(step: int) -> int:
    """Positions compared at once when the text is fed `step` tokens a call: whole steps, so
    the calls are those of feeding the whole text step by step."""
    return step * max(1, BLOCK // step)


class Reference:
    """The reference's float32 logits in a raw file [positions, vocabulary], read a block at a time
    (plain reads, not a memory map, so what was read does not stay in this process)."""

    def __init__(self, path: Path, positions: int, vocabulary: int) -> None:
        expected = positions * vocabulary * 4
        if Path(path).stat().st_size != expected:
            raise ValueError(f"{path}: {Path(path).stat().st_size} bytes, not {positions} x {vocabulary} float32")
        self.path, self.positions, self.vocabulary = Path(path), positions, vocabulary

    def rows(self, start: int, stop: int) -> np.ndarray:
        return np.fromfile(self.path, dtype=np.float32, count=(stop - start) * self.vocabulary,
                           offset=start * self.vocabulary * 4).reshape(stop - start, self.vocabulary)


def peak_memory_mb() -> int:
    """This process's peak resident memory: Linux's VmHWM, which starts afresh at exec (a child's
    ru_maxrss starts from its parent's at the fork)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # kilobytes on Linux


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities of float64 logits, row by row."""
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


class Agreement:
    """Same top token, KL divergence from the reference and the largest logit difference,
    accumulated a block of positions at a time.

    KL(P_ref || P) = sum p_ref (log p_ref - log p) at each position, in float64 from the
    float32 logits, as llama.cpp's `llama-perplexity --kl-divergence` reports it."""

    def __init__(self) -> None:
        self.same_top = 0
        self.divergences: list[np.ndarray] = []
        self.largest_difference = 0.0

    def add(self, reference: np.ndarray, got: np.ndarray) -> None:
        """Compare the float32 logits [rows, vocabulary] of one block of positions."""
        if reference.shape != got.shape:
            raise ValueError(f"logits of shape {got.shape} against the reference's {reference.shape}")
        for start in range(0, len(reference), ROWS_AT_ONCE):
            expected, actual = reference[start : start + ROWS_AT_ONCE], got[start : start + ROWS_AT_ONCE]
            self.same_top += int((expected.argmax(-1) == actual.argmax(-1)).sum())
            self.largest_difference = max(self.largest_difference, float(np.abs(actual - expected).max()))
            log_p = log_softmax(expected.astype(np.float64))
            log_q = log_softmax(actual.astype(np.float64))
            self.divergences.append((np.exp(log_p) * (log_p - log_q)).sum(-1))

    def summary(self) -> dict:
        divergences = np.concatenate(self.divergences)
        return {
            "positions": len(divergences),
            "same_top_token": self.same_top / len(divergences),
            "mean_kl_divergence": float(divergences.mean()),
            "kl_divergence_p99": float(np.percentile(divergences, 99)),
            "largest_logit_difference": self.largest_difference,
        }
