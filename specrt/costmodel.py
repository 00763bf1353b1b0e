"""Choosing k each round: expected tokens per millisecond from acceptance estimates and measured step costs.

A round that drafts k tokens costs k draft steps plus one target pass over k + 1 positions and yields
E(k) = 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens, where a_i is the probability that the i-th draft is
accepted given the ones before it were (with one constant a this is Leviathan et al.'s
(1 - a^(k+1)) / (1 - a)). The model picks the k (0 included: plain decoding) that maximises
E(k) / (k t_draft + t_target(k + 1)), with t_target from the bundle's measured cost profile, rescaled online
by what the steps actually take in this process, and the a_i learned online with exponential forgetting.
The module knows nothing about sessions; the speculator reports each round to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class AcceptanceEstimate:
    """Per-position conditional acceptance a_i, exponentially weighted (recent rounds count more)."""

    max_k: int = 16
    decay: float = 0.9  # weight of the past per observation; ~10 rounds of memory
    prior: float = 0.7  # a_i before any evidence
    prior_weight: float = 2.0
    _hits: list[float] = field(default_factory=list)
    _trials: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._hits = [0.0] * self.max_k
        self._trials = [0.0] * self.max_k

    def rate(self, i: int) -> float:
        """a_{i+1}: probability that draft i (0-based) is accepted once drafts 0..i-1 were."""
        i = min(i, self.max_k - 1)
        return (self._hits[i] + self.prior * self.prior_weight) / (self._trials[i] + self.prior_weight)

    def expected_tokens(self, k: int) -> float:
        total, survive = 1.0, 1.0
        for i in range(k):
            survive *= self.rate(i)
            total += survive
        return total

    def update(self, drafted: int, accepted: int) -> None:
        """Drafts 0..accepted-1 were accepted; draft `accepted` (if any) was the first rejection."""
        for i in range(min(drafted, accepted + 1, self.max_k)):
            self._trials[i] = self.decay * self._trials[i] + 1.0
            self._hits[i] = self.decay * self._hits[i] + (1.0 if i < accepted else 0.0)


@dataclass
class StepCost:
    """Milliseconds for a forward of S new tokens: a measured profile curve, rescaled by live timings."""

    profile: Callable[[int, int], float]  # (S, context length) -> ms, measured offline on this machine
    decay: float = 0.8
    scale: float = 1.0  # live / profiled, smoothed

    def ms(self, width: int, context: int) -> float:
        return self.profile(width, context) * self.scale

    def observe(self, width: int, context: int, ms: float) -> None:
        expected = self.profile(width, context)
        if expected > 0 and ms > 0:
            # One odd timing (a page fault, a neighbour's burst) moves the scale by at most 20%; a lasting
            # change of speed still wins within a few rounds.
            ratio = min(max(ms / expected, 0.5 * self.scale), 2.0 * self.scale)
            self.scale = self.decay * self.scale + (1 - self.decay) * ratio


@dataclass
class CostModel:
    """k = argmax expected tokens/ms. While speculation does not pay, the acceptance estimate gets no new
    evidence, so now and then (after 8 such rounds, backing off to 256 while probes keep failing) one round
    is drafted (at least one token) with an optimistic acceptance: a prompt that turns repetitive, or a draft
    that is faster than believed, is noticed within a few rounds,
    and a prompt where drafting never pays spends well under 1% of its rounds on probes."""

    target: StepCost
    draft: StepCost | None  # None: free proposals (n-gram lookup)
    acceptance: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)
    probe_acceptance: float = 0.95
    _idle: int = 0  # rounds in a row without drafting
    _backoff: int = 8
    _probing: bool = False

    def tokens_per_ms(self, k: int, context: int, acceptance: float | None = None) -> float:
        draft = k * self.draft.ms(1, context) if self.draft is not None and k else 0.0
        if acceptance is None:
            expected = self.acceptance.expected_tokens(k)
        else:
            expected = sum(acceptance**i for i in range(k + 1))  # 1 + a + ... + a^k
        return expected / (draft + self.target.ms(k + 1, context))

    def choose(self, k_cap: int, context: int) -> int:
        """The k in 0..k_cap with the most expected tokens per millisecond (0: speculation does not pay)."""
        rates = {k: self.tokens_per_ms(k, context) for k in range(k_cap + 1)}
        k = max(rates, key=lambda j: (rates[j], -j))
        self._probing = False
        if k == 0 and k_cap > 0:
            self._idle += 1
            if self._idle >= self._backoff:
                optimistic = {j: self.tokens_per_ms(j, context, self.probe_acceptance) for j in range(k_cap + 1)}
                # At least one token: a probe also re-measures the draft's speed, so a cost that was
                # misjudged (or has changed) cannot keep speculation off for good.
                k = max(1, max(optimistic, key=lambda j: (optimistic[j], -j)))
                self._probing, self._idle = True, 0
        elif k > 0:  # speculation pays on its own evidence: the next dry spell is probed soon again
            self._idle, self._backoff = 0, 8
        return k

    def observe(self, k: int, accepted: int, context: int, draft_step_ms: float | None, target_ms: float) -> None:
        """One drafting round (k > 0): its acceptance, the mean time of one draft step (None: not measured)
        and the time of the target's (k + 1)-token pass."""
        self.acceptance.update(k, accepted)
        if self.draft is not None and draft_step_ms is not None:
            self.draft.observe(1, context, draft_step_ms)
        if self._probing:
            self._backoff = 8 if accepted == k else min(2 * self._backoff, 256)
        self.target.observe(k + 1, context, target_ms)
