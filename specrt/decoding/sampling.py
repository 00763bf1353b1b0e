"""Sampling primitives in numpy: logit warping, drawing a token with a given uniform, and the acceptance maths.

Everything here is a small pure function of float32 arrays, unit-tested on handmade distributions, and it
is the reference the in-graph sampler (specrt/export/sampler.py, run by specrt.runtime.sampler) is checked
against: both warp the same way, draw a token from the same uniform u by inverting the CDF of
unnormalised weights w (the token is the number of cumulative sums <= u * sum(w)), and accept a drafted
token x when u * q(x) < p(x). Given the same logits and uniforms the two give the same tokens (up to the
last bit of an exp, where a uniform lands within ~1e-6 of a CDF step).

The same `warp` is applied to draft and target logits, so speculative sampling reproduces the target's
*warped* distribution exactly (temperature, then top-k, then top-p, as transformers orders them).
"""

from __future__ import annotations

import math

import numpy as np

TOP_P_CANDIDATES = 256  # top-p looks at this many most likely tokens first, eight times more while short


def warp(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Probabilities (float32, rows sum to 1) from logits [..., V]; temperature must be > 0.

    top_k keeps every token at least as likely as the k-th; top_p keeps every token at least as likely as
    the one whose cumulative mass (most likely first) crosses top_p, so at least one token always is.
    Both are thresholds on the value, so tied tokens are kept or dropped together (as in the graph)."""
    x = np.asarray(logits, dtype=np.float32)
    # The maximum goes first: (x - max) <= 0 divided by any temperature > 0 stays finite or -inf, where
    # x / T with a tiny T would overflow to inf and inf - inf is NaN.
    x = (x - x.max(axis=-1, keepdims=True)) / np.float32(temperature)
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = np.partition(x, vocab - top_k, axis=-1)[..., vocab - top_k, None]
        x = np.where(x < kth, np.float32(-np.inf), x)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        flat = p.reshape(-1, vocab)
        keep = np.stack([row >= top_p_threshold(row, top_p) for row in flat])
        p = np.where(keep, flat, np.float32(0)).reshape(p.shape)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def top_p_threshold(p: np.ndarray, top_p: float) -> np.float32:
    """The probability of the token whose cumulative mass (most likely first) first reaches top_p. Sorts only
    a candidate set found by partitioning (O(V)), widened until it holds that mass: a full sort of a 150k
    vocabulary costs ~10 ms. The graph does the same with TopK over the same candidates."""
    vocab, m = p.shape[-1], TOP_P_CANDIDATES
    while True:
        top = -np.sort(-np.partition(-p, m - 1)[:m]) if m < vocab else -np.sort(-p)
        cum = np.cumsum(top, dtype=np.float32)
        if cum[-1] >= top_p or m >= vocab:
            break
        m *= 8
    inside = int(np.count_nonzero((cum - top) < np.float32(top_p)))  # mass strictly before it is below top_p
    return top[max(inside, 1) - 1]


def block_size(vocab: int) -> int:
    """Rows are read in blocks of this many tokens (the largest power of two <= 128 dividing the vocabulary)."""
    return math.gcd(vocab, 128)


def sample(weights: np.ndarray, u: float) -> int:
    """The token drawn by uniform u in [0, 1) from weights [V] (>= 0, not necessarily normalised): the
    number of cumulative sums <= u * total, which picks token x with probability w(x) / total. In two levels,
    as the graph does it: the block whose cumulative block sum passes u * total, then the position in it;
    each capped at the last block / token with weight, so a rounding at the very top never picks a token of
    weight 0."""
    w = np.asarray(weights, np.float32).reshape(-1, block_size(len(weights)))
    sums = w.sum(axis=1, dtype=np.float32)
    cum = np.cumsum(sums, dtype=np.float32)
    at = np.float32(u) * cum[-1]
    b = min(np.count_nonzero(cum <= at), _last_positive(sums))
    inside = np.cumsum(w[b], dtype=np.float32) + (cum[b - 1] if b else np.float32(0))
    return int(b * w.shape[1] + min(np.count_nonzero(inside <= at), _last_positive(w[b])))


def _last_positive(x: np.ndarray) -> int:
    positive = np.flatnonzero(x > 0)
    return int(positive[-1]) if positive.size else 0


def accepted(p_x: float, q_x: float, u: float) -> bool:
    """Leviathan et al.: keep a drafted token x with probability min(1, p(x) / q(x)), as u * q(x) < p(x).
    q(x) = 0 (the draft cannot have drawn x) accepts exactly when p(x) > 0."""
    return bool(np.float32(u) * np.float32(q_x) < np.float32(p_x))


def acceptance_probability(p_target: float, p_draft: float) -> float:
    """min(1, p(x) / q(x)): the probability `accepted` is True for a uniform u."""
    if p_draft <= 0.0:
        return 1.0 if p_target > 0.0 else 0.0
    return min(1.0, p_target / p_draft)


def residual(p_target: np.ndarray, p_draft: np.ndarray) -> np.ndarray:
    """The weights to resample from after a rejection: max(0, p - q), unnormalised (`sample` takes weights).

    Accept-or-resample then yields exactly p: P(x) = q(x) min(1, p(x)/q(x)) + (1 - beta) r(x) = p(x),
    where beta = sum_x min(p(x), q(x)) and r = (p - q)+ / (1 - beta).
    """
    r = np.maximum(np.asarray(p_target, np.float32) - np.asarray(p_draft, np.float32), np.float32(0))
    if r.sum() <= 0.0:  # p == q: a rejection has probability 0, keep a valid distribution anyway
        return np.asarray(p_target, np.float32)
    return r
