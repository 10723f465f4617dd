"""benchmarks/fidelity_stats.py: the figures fidelity.py and llama.cpp's side report, a block at
a time, are those of the whole matrices at once (KL divergence as torch computes it)."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from fidelity_stats import Agreement, Reference, block_for  # noqa: E402 (a benchmark module, numpy only)


def test_block_figures_match_the_whole_matrices(tmp_path):
    generator = np.random.default_rng(0)
    reference = (generator.standard_normal((70, 3000)) * 4).astype(np.float32)
    got = reference + (generator.standard_normal(reference.shape) * 0.3).astype(np.float32)
    got[5] = -got[5]  # a position whose top token surely moves
    path = tmp_path / "reference.f32"
    reference.tofile(path)
    stored = Reference(path, *reference.shape)
    agreement = Agreement()
    for start in range(0, 70, 32):  # blocks of 32, the last one short
        agreement.add(stored.rows(start, min(start + 32, 70)), got[start : start + 32])
    figures = agreement.summary()

    log_p = torch.from_numpy(reference).double().log_softmax(-1)
    log_q = torch.from_numpy(got).double().log_softmax(-1)
    divergences = torch.nn.functional.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)
    assert figures["positions"] == 70
    assert figures["same_top_token"] == float((reference.argmax(-1) == got.argmax(-1)).mean()) < 1
    assert figures["mean_kl_divergence"] == pytest.approx(float(divergences.mean()), rel=1e-9)
    assert figures["kl_divergence_p99"] == pytest.approx(float(divergences.quantile(0.99)), rel=1e-9)
    assert figures["largest_logit_difference"] == float(np.abs(got - reference).max())


def test_identical_logits_agree_exactly_and_a_wrong_size_is_refused(tmp_path):
    logits = np.linspace(-5, 5, 2 * 100, dtype=np.float32).reshape(2, 100)
    agreement = Agreement()
    agreement.add(logits, logits.copy())
    assert agreement.summary()["same_top_token"] == 1.0
    assert agreement.summary()["mean_kl_divergence"] == 0.0
    path = tmp_path / "reference.f32"
    logits.tofile(path)
    with pytest.raises(ValueError, match="not 2 x 101"):
        Reference(path, 2, 101)


def test_blocks_hold_whole_steps():
    assert [block_for(step) for step in (1, 9, 16, 64, 100)] == [64, 63, 64, 64, 100]
