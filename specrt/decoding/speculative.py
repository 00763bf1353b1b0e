"""The speculative maths of one row and one round in numpy: pick a token, verify drafts against the target.

A round for one sequence: a drafter proposes d_1..d_k (each drawn from the draft's distribution q_i, or
deterministic for prompt lookup), the target scores [last, d_1..d_k] in one pass, giving p_0..p_k, and
`accept_drafts` keeps the longest acceptable prefix plus one token of the target's own:
- greedy: accept while d_i is the target's argmax; then the target's argmax after the accepted prefix;
- sampling (Leviathan et al. 2023, Chen et al. 2023): accept d_i with probability min(1, p(d_i) / q(d_i));
  at the first rejection sample the residual max(0, p - q); after a full acceptance sample a bonus token
  from p_k. The output is distributed exactly as the target's (warped) p.

Randomness comes in as uniforms drawn from the request's own generator, in a fixed order (`draft_uniform`,
`verify_uniforms`): a sampled draft step takes one, a sampled verification of k drafts takes k + 1 (one per
draft, then one for the token after them) whatever happens. The in-graph sampler consumes the same uniforms
the same way, so a seeded request gives the same tokens on either path, alone or in any batch. This module
is that path's reference; positions, stopping, caches and batching belong to the scheduler, k to tuning.
"""

from __future__ import annotations

import numpy as np

from ..options import GenerationOptions
from .sampling import accepted, residual, sample, warp


def draft_uniform(options: GenerationOptions, rng: np.random.Generator) -> float | None:
    """The uniform a draft step consumes (None when greedy: greedy rows draw nothing)."""
    return None if options.greedy else float(rng.random(dtype=np.float32))


def verify_uniforms(options: GenerationOptions, rng: np.random.Generator, k: int) -> np.ndarray | None:
    """The k + 1 uniforms a verification of k drafts consumes: k acceptance tests, then the next token."""
    return None if options.greedy else rng.random(k + 1, dtype=np.float32)


def probabilities(logits: np.ndarray, options: GenerationOptions) -> np.ndarray:
    """The warped distribution the row samples from (the same warp for draft and target)."""
    return warp(logits, options.temperature, options.top_k, options.top_p)


def pick(logits: np.ndarray, options: GenerationOptions, u: float | None) -> tuple[int, np.ndarray | None, float]:
    """The next token from one row of logits: (token, the distribution it was drawn from (a draft's q; None
    when greedy), the probability the row gave it (the draft's confidence))."""
    if options.greedy:
        return int(logits.argmax()), None, top_probability(logits)
    probs = probabilities(logits[None], options)[0]
    token = sample(probs, u)
    return token, probs, float(probs[token])


def accept_drafts(
    logits: np.ndarray,
    drafted: list[int],
    q: list[np.ndarray | None],
    options: GenerationOptions,
    u: np.ndarray | None,
) -> tuple[int, int]:
    """logits [k + 1, V]: row i predicts the token after drafted[:i]. Returns (accepted drafts, next token).
    With no drafts (k = 0) this is a plain decoding step: the target's argmax, or a sample of its p."""
    if options.greedy:
        return accept_greedy(logits, drafted)
    return accept_sampled(probabilities(logits, options), drafted, q, u)


def accept_greedy(logits: np.ndarray, drafted: list[int]) -> tuple[int, int]:
    """Accept the longest prefix on which the target's argmax agrees, then take the target's token."""
    best = logits.argmax(axis=-1)
    for i, token in enumerate(drafted):
        if best[i] != token:
            return i, int(best[i])
    return len(drafted), int(best[len(drafted)])


def accept_sampled(p: np.ndarray, drafted: list[int], q: list[np.ndarray | None], u: np.ndarray) -> tuple[int, int]:
    """Rejection sampling with uniforms u [k + 1]. A deterministic proposal (q None: prompt lookup) is
    one-hot: accepted with probability p(x), since q(x) = 1, and its residual is p with x removed."""
    for i, token in enumerate(drafted):
        if accepted(p[i, token], q[i][token] if q[i] is not None else 1.0, u[i]):
            continue
        qi = q[i] if q[i] is not None else _one_hot(token, p.shape[-1])  # built only on a rejection
        return i, sample(residual(p[i], qi), u[len(drafted)])
    # Every draft accepted: the bonus token comes from the target's distribution after the last draft.
    return len(drafted), sample(p[len(drafted)], u[len(drafted)])


def _one_hot(token: int, size: int) -> np.ndarray:
    v = np.zeros(size, np.float32)
    v[token] = 1.0
    return v


def top_probability(logits: np.ndarray) -> float:
    """softmax(logits).max() = 1 / sum(exp(logits - max)), without building the distribution: a greedy
    draft's confidence in its own token."""
    x = logits.astype(np.float32, copy=False)
    return float(1.0 / np.exp(x - x.max()).sum())
