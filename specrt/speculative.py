"""The speculative step: a drafter proposes k tokens, the target verifies them in one pass, we accept.

This module is the maths of one round and the choice of its k; positions, stopping, streaming and
statistics belong to the generate loop. With k = 0 (or no drafter) a round is one plain target decoding
step, so target-only decoding runs through exactly this code.

Invariant between rounds, for the sequence `tokens` (prompt + generated so far):
  the target's KV cache holds tokens[:-1] (the last token is fed at the start of the next round), and a
  draft model's cache holds a prefix of `tokens` (it catches up on whatever it has not seen when it drafts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .costmodel import CostModel
from .drafters import ModelDrafter, NgramDrafter
from .options import GenerationOptions
from .sampling import acceptance_probability, residual, sample, warp
from .session import ModelSession


@dataclass
class RoundTimes:
    draft_s: float = 0.0
    target_s: float = 0.0


class Speculator:
    def __init__(
        self,
        target: ModelSession,
        drafters: list[ModelDrafter | NgramDrafter],
        options: GenerationOptions,
        costs: dict[str, CostModel] | None = None,
    ):
        # Cheapest first: n-gram lookup costs nothing, so it is tried before a draft model.
        self.drafters = sorted(drafters, key=lambda d: d.name != "ngram")
        self.target, self.options, self.costs = target, options, costs or {}
        self.rng = np.random.default_rng(options.seed)
        self.times = RoundTimes()
        self.last_drafter: str | None = None

    @property
    def draft_session(self) -> ModelSession | None:
        return next((d.session for d in self.drafters if isinstance(d, ModelDrafter)), None)

    def _probs(self, logits: np.ndarray) -> np.ndarray:
        o = self.options
        return warp(logits, o.temperature, o.top_k, o.top_p)

    def _pick(self, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        if self.options.greedy:
            return int(logits.argmax()), None
        probs = self._probs(logits[None])[0]
        return sample(probs, self.rng), probs

    def prefill(self, tokens: list[int]) -> int:
        """Feed the uncached part of the prompt to the target and pick the first new token."""
        t0 = time.perf_counter()
        first, _ = self._pick(self.target.forward(tokens[self.target.kv.length :], keep=1)[-1])
        self.times.target_s += time.perf_counter() - t0
        return first

    def step(self, tokens: list[int], max_tokens: int) -> tuple[list[int], int]:
        """One round yielding at most `max_tokens` tokens: (accepted drafts + one target token, drafted)."""
        t0 = time.perf_counter()
        drafter, drafted, q = self._draft(tokens, max_tokens)
        k = len(drafted)
        t1 = time.perf_counter()
        # One target pass scores the last token and every draft: row i predicts the token after drafted[:i].
        logits = self.target.forward([tokens[-1], *drafted], keep=k + 1)
        forward_s = time.perf_counter() - t1
        n, nxt = self._verify_greedy(logits, drafted) if self.options.greedy else self._verify(logits, drafted, q)
        # Rejected drafts leave the caches by moving their length counters; no buffer is touched.
        self.target.kv.rollback(k - n)
        for d in self.drafters:
            d.keep(len(tokens) + n)
        t2 = time.perf_counter()
        self.times.draft_s += t1 - t0
        self.times.target_s += t2 - t1
        # The cost model compares forwards with forwards: only the draft's per-token steps and the target
        # pass are timed for it (choosing k, lookups, sampling and catch-ups are overhead, reported apart).
        cost = self.costs.get(drafter.name) if drafter is not None else None
        if cost is not None:
            cost.observe(k, n, len(tokens), drafter.last_step_ms, 1000 * forward_s, drafter.last_confidences)
        elif self.costs:  # a plain step still tells how fast the target runs now (one shared StepCost)
            next(iter(self.costs.values())).target.observe(1, len(tokens), 1000 * forward_s)
        self.last_drafter = drafter.name if drafter is not None else None
        return [*drafted[:n], nxt], k

    def _draft(self, tokens: list[int], remaining: int):
        """Pick a drafter and k for this round; the round may yield at most `remaining` tokens, k drafts and
        the target's own. With a fixed k the cheapest drafter that has something to offer drafts (n-gram
        lookup before the model); with auto k each drafter's cost model picks its k and the one promising the
        most tokens per millisecond drafts: a weak n-gram match must not displace a strong draft model."""
        fixed = self.options.num_draft_tokens
        # The sequence, and the target's k + 1 fed positions, must fit its buffer.
        k_cap = min(
            remaining - 1,
            fixed if fixed is not None else self.options.max_draft_tokens,
            self.target.max_len - len(tokens) - 1,
        )
        best = None  # (expected tokens/ms, drafter, k, n-gram proposal)
        for drafter in self.drafters:
            cap = min(k_cap, drafter.capacity(len(tokens)))
            found = None
            if isinstance(drafter, NgramDrafter):  # free to look up first: its length caps k
                found = drafter.lookup(tokens, cap)
                cap = len(found)
            if cap <= 0:
                continue
            cost = self.costs.get(drafter.name)
            if fixed is not None or cost is None:
                best = (0.0, drafter, cap, found)
                break
            k = cost.choose(cap, len(tokens), drafter.behind(len(tokens)), remaining)
            rate = cost.tokens_per_ms(k, len(tokens)) if k else 0.0
            if k and (best is None or rate > best[0]):
                best = (rate, drafter, k, found)
        if best is None:
            return None, [], []
        _, drafter, k, found = best
        if found is not None:
            return drafter, found[:k], [None] * k
        cost = self.costs.get(drafter.name) if fixed is None else None
        # Under auto k the chosen k is a ceiling: the draft stops early where its own confidence says the
        # rest of the round would likely be rejected (a fixed k drafts exactly k).
        more = (lambda confidences: cost.keep_drafting(confidences, k, len(tokens))) if cost is not None else None
        drafted, q = drafter.propose(tokens, k, self._pick, more)
        return drafter, drafted, q

    @staticmethod
    def _verify_greedy(logits: np.ndarray, drafted: list[int]) -> tuple[int, int]:
        """Accept the longest prefix on which the target's argmax agrees, then take the target's token."""
        best = logits.argmax(axis=-1)
        for i, token in enumerate(drafted):
            if best[i] != token:
                return i, int(best[i])
        return len(drafted), int(best[len(drafted)])

    def _verify(self, logits: np.ndarray, drafted: list[int], q: list[np.ndarray | None]) -> tuple[int, int]:
        """Rejection sampling (Leviathan et al. 2023, Chen et al. 2023): the output is distributed as p.
        A deterministic proposal (q None) is one-hot: accepted with probability p(x) (q(x) = 1)."""
        p = self._probs(logits)
        for i, token in enumerate(drafted):
            if self.rng.random() < acceptance_probability(p[i, token], q[i][token] if q[i] is not None else 1.0):
                continue
            qi = q[i] if q[i] is not None else _one_hot(token, p.shape[-1])  # built only on a rejection
            return i, sample(residual(p[i], qi), self.rng)
        # Every draft accepted: the bonus token comes from the target's distribution after the last draft.
        return len(drafted), sample(p[len(drafted)], self.rng)


def _one_hot(token: int, size: int) -> np.ndarray:
    v = np.zeros(size)
    v[token] = 1.0
    return v
