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
their k as if alone (costmodel.py: probes, catch-ups, plain-step timing, margins); the batch then takes the
common ceiling K on those choices that maximises gain / cost. While a batch's cores are idle between
memory-bound steps, verify costs little and every row drafts its own k; as rows fill the cores, t(B, W)
grows with B * W and K falls, to 0 (plain batching) when speculation would spend compute that batching
needs. The ceiling moves only when the new one promises `margin` more tokens/s than the current one, so
a batch near the break-even point does not thrash between two values from round to round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

BATCHES = (1, 2, 4, 8)
WIDTHS = tuple(range(1, 10))
CONTEXTS = (64, 512)  # measured context lengths; between and past them t is linear in the context
# Timed rounds per cell. With 2, one disturbed round moved a cell's median by half: a native 1.5B profile
# stored t(8, 1) = 180 ms against 120 measured again, which priced a 2-token verify at 1.14 plain steps
# instead of 1.55, and auto k drafted 1 token per row at 8 requests, 0.87x plain batching. A median of 4
# interleaved rounds outvotes one disturbed round on either side.
REPS = 4


@dataclass
class BatchProfile:
    """Milliseconds of one forward of B rows x S new tokens each, at one context length."""

    batches: list[int]
    widths: list[int]
    ms: list[list[float]]  # ms[batch index][width index], medians
    context: int = 512
    reps: int = 0  # timed rounds behind each median (0: a profile from before this was recorded)

    def __call__(self, batch: int, width: int) -> float:
        row = [self._at_width(r, width) for r in self.ms]
        if batch <= self.batches[0]:
            return row[0] * batch / self.batches[0]
        for (b0, t0), (b1, t1) in zip(
            zip(self.batches, row, strict=True), zip(self.batches[1:], row[1:], strict=True), strict=False
        ):
            if batch <= b1:
                return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
        return row[-1] * batch / self.batches[-1]  # past the largest measured batch: proportional

    def _at_width(self, row: list[float], width: int) -> float:
        if width in self.widths:
            return row[self.widths.index(width)]
        if width < self.widths[0]:
            return row[0]
        w0, w1 = self.widths[-2:]
        return row[-1] + (row[-1] - row[-2]) / (w1 - w0) * (width - w1)


@dataclass
class BatchProfiles:
    """t(B, S) at several context lengths: linear in the context between and past the measured ones (a
    longer context adds attention reads per row; never less than the shortest context's time)."""

    profiles: list[BatchProfile]  # by increasing context

    def __call__(self, batch: int, width: int, context: int | None = None) -> float:
        ps = self.profiles
        if context is None or len(ps) == 1:
            return ps[-1](batch, width)
        lo, hi = (ps[0], ps[1]) if context <= ps[1].context else (ps[-2], ps[-1])
        t_lo, t_hi = lo(batch, width), hi(batch, width)
        t = t_lo + (t_hi - t_lo) / (hi.context - lo.context) * (context - lo.context)
        return max(t, t_lo if lo is ps[0] else ps[0](batch, width))

    @property
    def reps(self) -> int:
        return min(p.reps for p in self.profiles)


def clamp_contexts(contexts: Sequence[int], max_len: int, widths: Sequence[int] = WIDTHS) -> list[int]:
    """The contexts a profile can be measured at in a session of max_len positions (a short one holds fewer)."""
    return sorted({max(0, min(c, max_len - max(widths))) for c in contexts})


def measure_batch(
    session, batches: Sequence[int], widths: Sequence[int], context: int = 512, reps: int = REPS
) -> BatchProfile:
    """t(B, S) at one context length (see measure_batches)."""
    return measure_batches(session, batches, widths, [context], reps).profiles[0]


def measure_batches(
    session, batches: Sequence[int], widths: Sequence[int], contexts: Sequence[int] = CONTEXTS, reps: int = REPS
) -> BatchProfiles:
    """t(B, S) at each context for a session with at least max(batches) rows; every cell once per round,
    rounds interleaved (order reversed every other round), medians, non-decreasing in S (more tokens never
    take less time; noise only adds)."""
    contexts = clamp_contexts(contexts, session.max_len, widths)
    slots = len(session.kv.rows)
    batches = [b for b in batches if b <= slots]
    cells = [(c, b, w) for c in contexts for b in batches for w in widths]
    times: dict[tuple[int, int, int], list[float]] = {cell: [] for cell in cells}
    for rnd in range(reps + 1):
        for c, b, w in cells if rnd % 2 else cells[::-1]:
            for s in range(b):
                session.kv.rows[s].reset()
                session.kv.rows[s].advance([0] * c)
            t0 = time.perf_counter()
            session.run(list(range(b)), [[0] * w] * b, [1] * b)
            if rnd:
                times[c, b, w].append(1000 * (time.perf_counter() - t0))
    for row in session.kv.rows:
        row.reset()
    profiles = []
    for c in contexts:
        ms = []
        for b in batches:
            row = [statistics.median(times[c, b, w]) for w in widths]
            ms.append([min(row[i:]) for i in range(len(row))])
        profiles.append(BatchProfile(list(batches), list(widths), ms, c, reps))
    return BatchProfiles(profiles)


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
    ) -> list[int]:
        """Per-row k for the round: each auto row's own choice, capped at the ceiling K that maximises the
        batch's expected tokens per millisecond. Fixed-k rows keep their k (it still widens the pass)."""

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
        self.ceiling = best
        self.history.append(best)
        del self.history[:-1000]
        return ks_for(best)

    def observe(self, predicted_ms: float, measured_ms: float) -> None:
        if predicted_ms > 0 and measured_ms > 0:
            observed = measured_ms / (predicted_ms / self.ratio)
            bounded = min(max(observed, 0.5 * self.ratio), 2.0 * self.ratio)
            self.ratio = self.decay * self.ratio + (1 - self.decay) * bounded
