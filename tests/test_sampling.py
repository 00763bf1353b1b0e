"""Sampling primitives and the acceptance maths on handmade distributions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specrt.decoding.sampling import acceptance_probability, residual, sample, warp
from specrt.decoding.speculative import accept_greedy


def test_warp_temperature_only_is_softmax():
    logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    p = warp(logits, temperature=0.5)
    assert p.dtype == np.float32  # the host loop never upcasts to float64
    e = np.exp(logits / 0.5)
    np.testing.assert_allclose(p, e / e.sum(-1, keepdims=True), rtol=1e-6)


def test_warp_top_k_and_top_p_by_hand():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    np.testing.assert_allclose(warp(logits, 1.0, top_k=2), [4 / 7, 3 / 7, 0, 0], rtol=1e-6)
    # top_p 0.6: 0.4 is below 0.6, so the token that crosses (0.3) is kept too.
    np.testing.assert_allclose(warp(logits, 1.0, top_p=0.6), [4 / 7, 3 / 7, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(warp(logits, 1.0, top_p=0.4), [1, 0, 0, 0])  # exactly at the threshold
    np.testing.assert_allclose(warp(logits, 1.0, top_p=0.05), [1, 0, 0, 0])  # always at least one token
    np.testing.assert_allclose(warp(logits, 1.0, top_k=3, top_p=0.8), [4 / 9, 3 / 9, 2 / 9, 0], rtol=1e-6)
    tied = np.log(np.array([0.3, 0.3, 0.2, 0.2]))
    np.testing.assert_allclose(warp(tied, 1.0, top_k=3), [0.3, 0.3, 0.2, 0.2], rtol=1e-6)  # ties stay together


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 20, 0.5)])
def test_warp_matches_transformers_warpers(temperature, top_k, top_p):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(4, 50))
    x = torch.tensor(logits)
    x = TemperatureLogitsWarper(temperature)(None, x)
    if top_k:
        x = TopKLogitsWarper(top_k)(None, x)
    if top_p < 1:
        x = TopPLogitsWarper(top_p)(None, x)
    expected = torch.softmax(x, -1).numpy()
    np.testing.assert_allclose(warp(logits, temperature, top_k, top_p), expected, atol=1e-6)


@pytest.mark.parametrize("vocab", [4, 384])
def test_sample_frequencies(vocab):
    p = np.zeros(vocab, np.float32)
    p[:4] = [0.5, 0.0, 0.3, 0.2]
    rng = np.random.default_rng(1)
    counts = np.bincount([sample(p, rng.random()) for _ in range(20_000)], minlength=vocab) / 20_000
    assert counts[1] == 0 and counts[4:].sum() == 0
    np.testing.assert_allclose(counts, p, atol=0.015)


def test_sample_is_the_inverse_cdf_and_never_picks_a_zero_weight():
    w = np.array([0.0, 2.0, 0.0, 1.0, 1.0, 0.0], np.float32)  # unnormalised: total 4
    assert [sample(w, u) for u in (0.0, 0.49, 0.5, 0.74, 0.75, 0.999999)] == [1, 1, 3, 3, 4, 4]
    assert sample(w, np.nextafter(np.float32(1), np.float32(0))) == 4  # u * total rounds to total: still 4


def test_acceptance_probability():
    assert acceptance_probability(0.2, 0.4) == 0.5
    assert acceptance_probability(0.4, 0.2) == 1.0
    assert acceptance_probability(0.0, 0.3) == 0.0
    assert acceptance_probability(0.3, 0.0) == 1.0  # unreachable in practice: the draft never draws it


def test_residual_by_hand():
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.6, 0.2])
    np.testing.assert_allclose(residual(p, q), [0.3, 0.0, 0.0], rtol=1e-6)  # unnormalised weights
    p, q = np.array([0.4, 0.4, 0.2]), np.array([0.1, 0.3, 0.6])
    np.testing.assert_allclose(residual(p, q), [0.3, 0.1, 0.0], rtol=1e-6)
    np.testing.assert_allclose(residual(p, p), p)  # degenerate case stays a distribution


@pytest.mark.parametrize("seed", range(5))
def test_accept_or_resample_yields_exactly_p(seed):
    """P(out = x) = q(x) min(1, p(x)/q(x)) + P(reject) r(x) must equal p(x) for any p, q."""
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(12) * 0.5), rng.dirichlet(np.ones(12) * 0.5)
    p[3] = 0.0
    p /= p.sum()
    accept = np.array([acceptance_probability(p[x], q[x]) for x in range(12)])
    reject_mass = 1.0 - (q * accept).sum()
    r = residual(p, q).astype(np.float64)
    out = q * accept + reject_mass * r / r.sum()
    np.testing.assert_allclose(out, p, atol=1e-6)


def test_greedy_verification_rule():
    logits = np.full((4, 6), -1.0)
    logits[0, 2] = logits[1, 5] = logits[2, 1] = logits[3, 0] = 1.0  # target argmax: 2, 5, 1, 0
    assert accept_greedy(logits, [2, 5, 1]) == (3, 0)  # all accepted, bonus token 0
    assert accept_greedy(logits, [2, 4, 1]) == (1, 5)  # stop at the first disagreement
    assert accept_greedy(logits, [3, 5, 1]) == (0, 2)
    assert accept_greedy(logits[:1], []) == (0, 2)  # k = 0: a plain decoding step


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.999])
def test_top_p_on_a_large_vocabulary_matches_transformers(top_p):
    """Large vocabularies take the partition path (candidate set widened until it holds top_p). transformers
    sums in float64, specrt in float32: the two kept sets may differ only by the token at the threshold."""
    logits = np.random.default_rng(1).normal(0, 2, size=(3, 20_000))
    expected = torch.softmax(TopPLogitsWarper(top_p)(None, torch.tensor(logits)), -1).numpy()
    got = warp(logits, 1.0, 0, top_p)
    for row, ours, theirs in zip(logits, got, expected, strict=True):
        p = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        desc = np.sort(p)[::-1]
        mass_before = dict(zip(np.argsort(-p).tolist(), np.cumsum(desc) - desc, strict=True))
        for token in np.flatnonzero((ours > 0) != (theirs > 0)):
            assert abs(mass_before[int(token)] - top_p) < 1e-5, (token, mass_before[int(token)])
        same = (ours > 0) & (theirs > 0)
        np.testing.assert_allclose(ours[same] / ours[same].sum(), theirs[same] / theirs[same].sum(), rtol=1e-5)
