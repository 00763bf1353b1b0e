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
    e = np.exp(logits / 0.5)
    np.testing.assert_allclose(p, e / e.sum(-1, keepdims=True))


def test_warp_top_k_and_top_p_by_hand():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    np.testing.assert_allclose(warp(logits, 1.0, top_k=2), [4 / 7, 3 / 7, 0, 0])
    # top_p 0.6: 0.4 is below 0.6, so the token that crosses (0.3) is kept too.
    np.testing.assert_allclose(warp(logits, 1.0, top_p=0.6), [4 / 7, 3 / 7, 0, 0])
    np.testing.assert_allclose(warp(logits, 1.0, top_p=0.4), [1, 0, 0, 0])  # exactly at the threshold
    np.testing.assert_allclose(warp(logits, 1.0, top_p=0.05), [1, 0, 0, 0])  # always at least one token
    np.testing.assert_allclose(warp(logits, 1.0, top_k=3, top_p=0.8), [4 / 9, 3 / 9, 2 / 9, 0])


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
    np.testing.assert_allclose(warp(logits, temperature, top_k, top_p), expected, atol=1e-12)


def test_sample_frequencies():
    p = np.array([0.5, 0.0, 0.3, 0.2])
    rng = np.random.default_rng(1)
    counts = np.bincount([sample(p, rng) for _ in range(20_000)], minlength=4) / 20_000
    assert counts[1] == 0
    np.testing.assert_allclose(counts, p, atol=0.015)


def test_acceptance_probability():
    assert acceptance_probability(0.2, 0.4) == 0.5
    assert acceptance_probability(0.4, 0.2) == 1.0
    assert acceptance_probability(0.0, 0.3) == 0.0
    assert acceptance_probability(0.3, 0.0) == 1.0  # unreachable in practice: the draft never draws it


def test_residual_by_hand():
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.6, 0.2])
    np.testing.assert_allclose(residual(p, q), [1.0, 0.0, 0.0])
    p, q = np.array([0.4, 0.4, 0.2]), np.array([0.1, 0.3, 0.6])
    np.testing.assert_allclose(residual(p, q), [0.75, 0.25, 0.0])
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
    out = q * accept + reject_mass * residual(p, q)
    np.testing.assert_allclose(out, p, atol=1e-12)


def test_greedy_verification_rule():
    logits = np.full((4, 6), -1.0)
    logits[0, 2] = logits[1, 5] = logits[2, 1] = logits[3, 0] = 1.0  # target argmax: 2, 5, 1, 0
    assert accept_greedy(logits, [2, 5, 1]) == (3, 0)  # all accepted, bonus token 0
    assert accept_greedy(logits, [2, 4, 1]) == (1, 5)  # stop at the first disagreement
    assert accept_greedy(logits, [3, 5, 1]) == (0, 2)
    assert accept_greedy(logits[:1], []) == (0, 2)  # k = 0: a plain decoding step


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.999])
def test_top_p_on_a_large_vocabulary_matches_transformers(top_p):
    """Large vocabularies take the partition path (candidate set widened until it holds top_p)."""
    logits = np.random.default_rng(1).normal(0, 2, size=(3, 20_000))
    expected = torch.softmax(TopPLogitsWarper(top_p)(None, torch.tensor(logits)), -1).numpy()
    np.testing.assert_allclose(warp(logits, 1.0, 0, top_p), expected, atol=1e-12)
