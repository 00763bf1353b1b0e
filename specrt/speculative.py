"""The speculative step: the draft proposes k tokens, the target verifies them in one pass, we accept.

This module is the maths of one round and nothing else; positions, stopping, streaming and statistics
belong to the generate loop. With k = 0 (or no draft) a round is one plain target decoding step, so
target-only decoding runs through exactly this code.

Invariant between rounds, for the sequence `tokens` (prompt + generated so far):
  the target's KV cache holds tokens[:-1] (the last token is fed at the start of the next round), and the
  draft's cache holds a prefix of `tokens` (it catches up on whatever it has not seen when it drafts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .options import GenerationOptions
from .sampling import acceptance_probability, residual, sample, warp
from .session import ModelSession


@dataclass
class RoundTimes:
    draft_s: float = 0.0
    target_s: float = 0.0


class Speculator:
    def __init__(self, target: ModelSession, draft: ModelSession | None, options: GenerationOptions):
        self.target, self.draft, self.options = target, draft, options
        self.rng = np.random.default_rng(options.seed)
        self.times = RoundTimes()

    def _probs(self, logits: np.ndarray) -> np.ndarray:
        o = self.options
        return warp(logits, o.temperature, o.top_k, o.top_p)

    def prefill(self, tokens: list[int]) -> int:
        """Feed the uncached part of the prompt to the target and pick the first new token."""
        t0 = time.perf_counter()
        logits = self.target.forward(tokens[self.target.kv.length :], keep=1)
        first = int(logits[-1].argmax()) if self.options.greedy else sample(self._probs(logits)[-1], self.rng)
        self.times.target_s += time.perf_counter() - t0
        return first

    def step(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """One round. Returns (new tokens: the accepted drafts plus one target token, number drafted)."""
        t0 = time.perf_counter()
        drafted, q = self._propose(tokens, k) if k > 0 else ([], [])
        t1 = time.perf_counter()
        # One target pass scores the last token and every draft: row i predicts the token after drafted[:i].
        logits = self.target.forward([tokens[-1], *drafted], keep=k + 1)
        n, nxt = self._verify_greedy(logits, drafted) if self.options.greedy else self._verify(logits, drafted, q)
        # Rejected drafts leave both caches by moving their length counters; no buffer is touched.
        self.target.kv.rollback(k - n)
        if self.draft is not None:
            self.draft.kv.truncate(len(tokens) + n)
        t2 = time.perf_counter()
        self.times.draft_s += t1 - t0
        self.times.target_s += t2 - t1
        return [*drafted[:n], nxt], k

    def _propose(self, tokens: list[int], k: int) -> tuple[list[int], list[np.ndarray]]:
        """Draft k tokens autoregressively; keep each one's draft distribution q for the acceptance test."""
        assert self.draft is not None
        drafted: list[int] = []
        q: list[np.ndarray] = []
        feed = tokens[self.draft.kv.length :]  # the last token, or more after a full acceptance
        for _ in range(k):
            logits = self.draft.forward(feed, keep=1)[-1]
            if self.options.greedy:
                token = int(logits.argmax())
            else:
                probs = self._probs(logits)
                token = sample(probs, self.rng)
                q.append(probs)
            drafted.append(token)
            feed = [token]
        return drafted, q

    @staticmethod
    def _verify_greedy(logits: np.ndarray, drafted: list[int]) -> tuple[int, int]:
        """Accept the longest prefix on which the target's argmax agrees, then take the target's token."""
        best = logits.argmax(axis=-1)
        for i, token in enumerate(drafted):
            if best[i] != token:
                return i, int(best[i])
        return len(drafted), int(best[len(drafted)])

    def _verify(self, logits: np.ndarray, drafted: list[int], q: list[np.ndarray]) -> tuple[int, int]:
        """Rejection sampling (Leviathan et al. 2023, Chen et al. 2023): the output is distributed as p."""
        p = self._probs(logits)
        for i, token in enumerate(drafted):
            if self.rng.random() < acceptance_probability(p[i, token], q[i][token]):
                continue
            return i, sample(residual(p[i], q[i]), self.rng)
        # Every draft accepted: the bonus token comes from the target's distribution after the last draft.
        return len(drafted), sample(p[len(drafted)], self.rng)
