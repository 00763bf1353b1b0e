"""What the tuning learns about acceptance: per-position rates of one request's drafts, and how the draft
model's own confidence in a token maps to the target accepting it.

Both are exponentially weighted counts with a prior, updated only through `update` (called from
CostModel.observe) and read through `rates` / `rate`: small, pure bookkeeping, no timing.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptanceEstimate:
    """Per-position conditional acceptance a_i, exponentially weighted (recent rounds count more).

    Position 1's estimate starts from `prior`; every later position's from the estimate of the position
    before it, so a position with little evidence follows its neighbours rather than a fixed number. And the
    past fades once per drafting round at every position, tested or not: evidence at a position that is no
    longer drafted to does not last for ever. (When it did, one early rejection at position 5 of a code
    prompt kept a_5 at 0.66 while a_1..a_4 were 0.95; k = 5 then never looked worth it, so position 5 was
    never drafted again to correct it, and auto k ran at 0.9x of fixed k = 5.)"""

    max_k: int = 16
    decay: float = 0.9  # weight of the past per drafting round; ~10 rounds of memory
    prior: float = 0.7  # a_1 before any evidence
    prior_weight: float = 2.0
    _hits: list[float] = field(default_factory=list)
    _trials: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._hits = [0.0] * self.max_k
        self._trials = [0.0] * self.max_k

    def rates(self, k: int) -> list[float]:
        """[a_1, ..., a_k]: each position's evidence, shrunk towards the estimate of the one before it."""
        out, prior = [], self.prior
        for i in range(k):
            j = min(i, self.max_k - 1)
            prior = (self._hits[j] + prior * self.prior_weight) / (self._trials[j] + self.prior_weight)
            out.append(prior)
        return out

    def rate(self, i: int) -> float:
        """a_{i+1}: probability that draft i (0-based) is accepted once drafts 0..i-1 were."""
        return self.rates(i + 1)[-1]

    def expected_tokens(self, k: int) -> float:
        total, survive = 1.0, 1.0
        for a in self.rates(k):
            survive *= a
            total += survive
        return total

    def rebase(self, weight: float) -> None:
        """Keep what was learned as a prior worth at most `weight` observations per position: a new prompt's
        own rounds then outweigh it within a few rounds (code after prose, or prose after code)."""
        for i, trials in enumerate(self._trials):
            if trials > weight:
                self._hits[i] *= weight / trials
                self._trials[i] = weight

    def update(self, drafted: int, accepted: int) -> None:
        """Drafts 0..accepted-1 were accepted; draft `accepted` (if any) was the first rejection; the drafts
        after it were never tested and teach nothing, but their old evidence fades like everyone's."""
        tested = min(drafted, accepted + 1, self.max_k)
        for i in range(self.max_k):
            self._trials[i] = self.decay * self._trials[i] + (1.0 if i < tested else 0.0)
            self._hits[i] = self.decay * self._hits[i] + (1.0 if i < min(tested, accepted) else 0.0)


@dataclass
class ConfidenceCalibration:
    """P(a drafted token is accepted | the draft's own probability of it), per probability bucket, learned
    online with exponential forgetting. The draft model's confidence is informative but not calibrated
    against the target (a 0.5-confident draft token of the bundled code pair is accepted ~60% of the time,
    a 0.9-confident one ~98%), hence the table; a bucket without evidence believes the confidence."""

    edges: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99)
    decay: float = 0.98  # per observation of the bucket: a slow drift, the table describes the pair
    prior_weight: float = 2.0
    _hits: list[float] = field(default_factory=list)
    _trials: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._hits = [0.0] * len(self.edges)
        self._trials = [0.0] * len(self.edges)

    def _bucket(self, confidence: float) -> int:
        return max(i for i, edge in enumerate(self.edges) if confidence >= edge) if confidence > 0 else 0

    def rate(self, confidence: float) -> float:
        b = self._bucket(confidence)
        upper = self.edges[b + 1] if b + 1 < len(self.edges) else 1.0
        prior = (self.edges[b] + upper) / 2
        return (self._hits[b] + prior * self.prior_weight) / (self._trials[b] + self.prior_weight)

    def update(self, confidence: float, accepted: bool) -> None:
        b = self._bucket(confidence)
        self._trials[b] = self.decay * self._trials[b] + 1.0
        self._hits[b] = self.decay * self._hits[b] + (1.0 if accepted else 0.0)
