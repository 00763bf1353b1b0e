"""Sampling primitives in numpy: logit warping, drawing a token, and the speculative acceptance maths.

Everything here is a small pure function of arrays, unit-tested on handmade distributions. The same
`warp` is applied to draft and target logits, so speculative sampling reproduces the target's *warped*
distribution exactly (temperature, then top-k, then top-p, as transformers orders them).
"""

from __future__ import annotations

import numpy as np


def warp(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Probabilities (float64, rows sum to 1) from logits [..., V]; temperature must be > 0.

    top_k keeps the k most likely tokens (0: all); top_p keeps the smallest most-likely set whose mass
    reaches top_p (the token that crosses the threshold is kept, so at least one token always is).
    """
    x = np.asarray(logits, dtype=np.float64)
    # The maximum goes first: (x - max) <= 0 divided by any temperature > 0 stays finite or -inf, where
    # x / T with a tiny T would overflow to inf and inf - inf is NaN.
    x = (x - x.max(axis=-1, keepdims=True)) / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = np.partition(x, vocab - top_k, axis=-1)[..., vocab - top_k, None]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        p = np.stack([_top_p_row(row, top_p) for row in p.reshape(-1, vocab)]).reshape(p.shape)
    return p


def _top_p_row(p: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest most-likely set with mass >= top_p. Sorts only a candidate set found by
    partitioning (O(V)), widened until it holds that mass: a full sort of a 150k vocabulary costs ~10 ms."""
    vocab, m = p.shape[-1], 256
    while True:
        if m >= vocab:
            order = np.argsort(-p, kind="stable")
        else:
            part = np.argpartition(-p, m)[:m]
            order = part[np.argsort(-p[part], kind="stable")]
        sorted_p = p[order]
        cum = np.cumsum(sorted_p)
        if cum[-1] >= top_p or m >= vocab:
            break
        m *= 8
    keep = order[(cum - sorted_p) < top_p]  # mass strictly before each token is still below top_p
    out = np.zeros_like(p)
    out[keep] = p[keep]
    return out / out.sum()


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a 1-D distribution by inverting its CDF with one uniform number."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), len(probs) - 1))


def acceptance_probability(p_target: float, p_draft: float) -> float:
    """Leviathan et al.: keep a drafted token x with probability min(1, p(x) / q(x))."""
    if p_draft <= 0.0:  # the draft cannot have drawn x; accept only if the target allows it
        return 1.0 if p_target > 0.0 else 0.0
    return min(1.0, p_target / p_draft)


def residual(p_target: np.ndarray, p_draft: np.ndarray) -> np.ndarray:
    """The distribution to resample from after a rejection: norm(max(0, p - q)).

    Accept-or-resample then yields exactly p: P(x) = q(x) min(1, p(x)/q(x)) + (1 - beta) r(x) = p(x),
    where beta = sum_x min(p(x), q(x)) and r = (p - q)+ / (1 - beta).
    """
    r = np.maximum(np.asarray(p_target, np.float64) - p_draft, 0.0)
    total = r.sum()
    if total <= 0.0:  # p == q: a rejection has probability 0, keep a valid distribution anyway
        return np.asarray(p_target, np.float64)
    return r / total
