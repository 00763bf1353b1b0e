"""k for a whole batch: what a batched round costs, and the per-row k that maximises the batch's tokens/s.

A round over B running rows drafts k_r tokens for row r and verifies every row in one target pass. The
pass is as wide as the widest row (W = max k_r + 1: rows are padded to it), and draft position j runs one
batched step over the B_j rows still drafting, so

    cost(k) = t_target(B, W) + sum_j t_draft(B_j, 1)         gain(k) = sum_r E_r(k_r)

with E_r the expected tokens of row r (its own acceptance estimate) and t(B, S) measured for this bundle
on this machine (`BatchProfile`, interpolated between measured batch sizes) at two context lengths, read
at the batch's longest row (`BatchProfiles`): the pass attends every row over that length, a cost per row
that makes a plain step of many rows dearer at long contexts and speculation relatively cheaper there
(native 1.5B, 8 rows: t(8, 2) / t(8, 1) = 1.52 at 64 tokens, 1.44 at 512). The round's rows first choose
their k as if alone (costmodel.py: probes, plain-step timing, early stops); the batch then takes the
common ceiling K on those choices that maximises gain / cost. While a batch's cores are idle between
memory-bound steps, verify costs little and every row drafts its own k; as rows fill the cores, t(B, W)
grows with B * W and K falls, to 0 (plain batching) when speculation would spend compute that batching
needs. The ceiling moves only when the new one promises `margin` more tokens/s than the current one, so
a batch near the break-even point does not thrash between two values from round to round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .profile import BatchProfile, BatchProfiles


@dataclass(frozen=True)
class BatchChoice:
    """The round's ceiling K and each row's k under it."""

    ceiling: int
    ks: list[int]


@dataclass
class BatchCost:
    target: BatchProfiles | BatchProfile  # a single profile is read at its one context
    draft: BatchProfiles | BatchProfile | None
    margin: float = 0.05  # a new ceiling must promise this much more tokens/s than the current one
    decay: float = 0.8
    ratio: float = 1.0  # live / profiled time of batched rounds, smoothed (the machine's drift)
    ceiling: int | None = None  # the K in force
    history: list[int] = field(default_factory=list)  # K per batched round (for the no-flapping check)

    def __post_init__(self) -> None:
        if isinstance(self.target, BatchProfile):
            self.target = BatchProfiles([self.target])
        if isinstance(self.draft, BatchProfile):
            self.draft = BatchProfiles([self.draft])

    def round_ms(self, ks: Sequence[int], drafting: Sequence[bool] | None = None, context: int | None = None) -> float:
        """Predicted milliseconds of a round with these k (drafting[r]: row r's drafts come from the draft
        model; prompt lookup's are free) when the longest row holds `context` tokens."""
        drafting = drafting if drafting is not None else [True] * len(ks)
        ms = self.target(len(ks), max(ks) + 1, context)
        if self.draft is not None:
            for j in range(1, max(ks) + 1):
                rows = sum(1 for k, d in zip(ks, drafting, strict=True) if d and k >= j)
                ms += self.draft(rows, 1, context) if rows else 0.0
        return ms * self.ratio

    def choose(
        self,
        wanted: Sequence[int],
        expected: Sequence[Callable[[int], float]],
        fixed: Sequence[bool],
        drafting: Sequence[bool],
        context: int | None = None,
    ) -> BatchChoice:
        """Per-row k for the round: each auto row's own choice, capped at the ceiling K that maximises the
        batch's expected tokens per millisecond. Fixed-k rows keep their k (it still widens the pass).
        A query: the ceiling in force changes only when the round is observed."""

        def ks_for(ceiling: int) -> list[int]:
            return [w if f else min(w, ceiling) for w, f in zip(wanted, fixed, strict=True)]

        def value(ceiling: int) -> float:
            ks = ks_for(ceiling)
            gain = sum(e(k) for e, k in zip(expected, ks, strict=True))
            return gain / self.round_ms(ks, drafting, context)

        top = max((w for w, f in zip(wanted, fixed, strict=True) if not f), default=0)
        candidates = {k: value(k) for k in range(top + 1)}
        best = max(candidates, key=lambda k: (candidates[k], -k))
        current = self.ceiling if self.ceiling is not None and self.ceiling in candidates else None
        if current is not None and candidates[current] * (1 + self.margin) >= candidates[best]:
            best = current  # not enough better to move
        return BatchChoice(best, ks_for(best))

    def observe(self, choice: BatchChoice, predicted_ms: float = 0.0, measured_ms: float = 0.0) -> None:
        """A batched round ran under `choice`: its ceiling is now the one in force, and its measured time
        against the predicted one moves the live ratio (the machine's drift)."""
        self.ceiling = choice.ceiling
        self.history.append(choice.ceiling)
        del self.history[:-1000]
        if predicted_ms > 0 and measured_ms > 0:
            observed = measured_ms / (predicted_ms / self.ratio)
            bounded = min(max(observed, 0.5 * self.ratio), 2.0 * self.ratio)
            self.ratio = self.decay * self.ratio + (1 - self.decay) * bounded
