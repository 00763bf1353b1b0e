"""The speculative maths of one row and one round: pick a token, verify drafts against the target's logits.

A round for one sequence: a drafter proposes d_1..d_k (each drawn from the draft's distribution q_i, or
deterministic for prompt lookup), the target scores [last, d_1..d_k] in one pass, giving p_0..p_k, and
`accept_drafts` keeps the longest acceptable prefix plus one token of the target's own:
- greedy: accept while d_i is the target's argmax; then the target's argmax after the accepted prefix;
- sampling (Leviathan et al. 2023, Chen et al. 2023): accept d_i with probability min(1, p(d_i) / q(d_i));
  at the first rejection sample the residual norm(max(0, p - q)); after a full acceptance sample a bonus
  token from p_k. The output is distributed exactly as the target's (warped) p.
Rows of a batch run these functions one by one, each with its own options and random generator, so a
row's tokens never depend on what else is in the batch. Positions, stopping, caches and batching belong to
the scheduler; which k to draft is specrt.tuning's business.
"""

from __future__ import annotations

import numpy as np

from ..options import GenerationOptions
from .sampling import acceptance_probability, residual, sample, warp


def probabilities(logits: np.ndarray, options: GenerationOptions) -> np.ndarray:
    """The warped distribution the row samples from (the same warp for draft and target)."""
    return warp(logits, options.temperature, options.top_k, options.top_p)


def pick(logits: np.ndarray, options: GenerationOptions, rng: np.random.Generator) -> tuple[int, np.ndarray | None]:
    """The next token from one row of logits: argmax when greedy (no distribution), else a sample and the
    distribution it was drawn from (a draft's q)."""
    if options.greedy:
        return int(logits.argmax()), None
    probs = probabilities(logits[None], options)[0]
    return sample(probs, rng), probs


def accept_drafts(
    logits: np.ndarray,
    drafted: list[int],
    q: list[np.ndarray | None],
    options: GenerationOptions,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """logits [k + 1, V]: row i predicts the token after drafted[:i]. Returns (accepted drafts, next token).
    With no drafts (k = 0) this is a plain decoding step: the target's argmax, or a sample of its p."""
    if options.greedy:
        return accept_greedy(logits, drafted)
    return accept_sampled(probabilities(logits, options), drafted, q, rng)


def accept_greedy(logits: np.ndarray, drafted: list[int]) -> tuple[int, int]:
    """Accept the longest prefix on which the target's argmax agrees, then take the target's token."""
    best = logits.argmax(axis=-1)
    for i, token in enumerate(drafted):
        if best[i] != token:
            return i, int(best[i])
    return len(drafted), int(best[len(drafted)])


def accept_sampled(
    p: np.ndarray, drafted: list[int], q: list[np.ndarray | None], rng: np.random.Generator
) -> tuple[int, int]:
    """Rejection sampling. A deterministic proposal (q None: prompt lookup) is one-hot: accepted with
    probability p(x), since q(x) = 1, and its residual is p with x removed."""
    for i, token in enumerate(drafted):
        if rng.random() < acceptance_probability(p[i, token], q[i][token] if q[i] is not None else 1.0):
            continue
        qi = q[i] if q[i] is not None else _one_hot(token, p.shape[-1])  # built only on a rejection
        return i, sample(residual(p[i], qi), rng)
    # Every draft accepted: the bonus token comes from the target's distribution after the last draft.
    return len(drafted), sample(p[len(drafted)], rng)


def _one_hot(token: int, size: int) -> np.ndarray:
    v = np.zeros(size)
    v[token] = 1.0
    return v


def top_probability(logits: np.ndarray) -> float:
    """softmax(logits).max() = 1 / sum(exp(logits - max)), without building the distribution: a greedy
    draft's confidence in its own token."""
    x = logits.astype(np.float32, copy=False)
    return float(1.0 / np.exp(x - x.max()).sum())
