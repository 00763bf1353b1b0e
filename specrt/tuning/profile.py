"""Step-cost profiles as data: milliseconds of one forward, measured on this machine, and how they are read
between and past the measured points.

- `CostProfile`: t(S, context) of one row (S new tokens after `context` cached ones), the per-request cost
  model's curve.
- `BatchProfile` / `BatchProfiles`: t(B, S) of B rows at one context length, and at several.
Both read widths through the same rule (`at_width`) and are checked with the same rules when read from disk
(`well_formed`): a damaged or hand-edited profile counts as none. Measuring and storing them is
measure.py's job; choosing k from them is costmodel.py's and batchcost.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def at_width(widths: Sequence[int], row: Sequence[float], width: int) -> float:
    """A row of times measured at `widths`, read at `width`: exact where measured, the narrowest's time below
    (fewer tokens never take longer), and past the widest extrapolated from the last two points (one
    measured width: proportional, an upper bound)."""
    if width in widths:
        return row[widths.index(width)]
    if width < widths[0]:
        return row[0]
    if len(widths) == 1:
        return row[0] * width / widths[0]
    w0, w1 = widths[-2:]
    return row[-1] + (row[-1] - row[-2]) / (w1 - w0) * (width - w1)


def _between(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Linear between measured points, flat outside them."""
    if x <= xs[0]:
        return ys[0]
    for x0, y0, x1, y1 in zip(xs, ys, xs[1:], ys[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


@dataclass
class CostProfile:
    machine: dict
    settings: str
    contexts: list[int]
    widths: list[int]
    ms: list[list[float]]  # ms[context index][width index], medians
    created: str = ""
    others_share: float | None = None  # share of the CPUs other processes took while it was measured

    def __call__(self, width: int, context: int) -> float:
        """t(width) at `context` tokens: linear in context between measured points, flat outside."""
        return _between(self.contexts, [at_width(self.widths, r, width) for r in self.ms], context)

    def table(self) -> str:
        """The profile as the text `specrt profile` prints."""
        lines = [f"cost profile ({self.settings}), ms per forward; columns: new tokens S"]
        lines.append("context " + "".join(f"{w:>8}" for w in self.widths))
        lines += [f"{c:>7} " + "".join(f"{v:8.1f}" for v in row) for c, row in zip(self.contexts, self.ms, strict=True)]
        c = self.contexts[0]
        ratios = " ".join(f"{w}:{self(w, c) / self(1, c):.2f}" for w in (2, 3, 5, 9, 16) if w in self.widths)
        return "\n".join([*lines, f"t(S)/t(1) at context {c}: {ratios}"])


@dataclass
class BatchProfile:
    """Milliseconds of one forward of B rows x S new tokens each, at one context length."""

    batches: list[int]
    widths: list[int]
    ms: list[list[float]]  # ms[batch index][width index], medians
    context: int = 512
    reps: int = 0  # timed rounds behind each median (0: a profile from before this was recorded)

    def __post_init__(self) -> None:
        # (batch, width) -> ms, read once: the batch's cost model reads the same few cells several times a
        # round, and a profile is data, never changed once made. (Not a field: not stored, not compared.)
        self._read: dict[tuple[int, int], float] = {}

    def __call__(self, batch: int, width: int) -> float:
        """Linear between measured batch sizes, proportional to the batch below the smallest and past the
        largest (a row's share of the run stays what it was measured at)."""
        ms = self._read.get((batch, width))
        if ms is None:
            ms = self._read[batch, width] = self._interpolate(batch, width)
        return ms

    def _interpolate(self, batch: int, width: int) -> float:
        row = [at_width(self.widths, r, width) for r in self.ms]
        if batch <= self.batches[0]:
            return row[0] * batch / self.batches[0]
        if batch > self.batches[-1]:
            return row[-1] * batch / self.batches[-1]
        return _between(self.batches, row, batch)


@dataclass
class BatchProfiles:
    """t(B, S) at several context lengths: linear in the context between and past the measured ones (a
    longer context adds attention reads per row; never less than the shortest context's time)."""

    profiles: list[BatchProfile]  # by increasing context
    others_share: float | None = None  # share of the CPUs other processes took while they were measured

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

    @classmethod
    def from_row(
        cls, step: CostProfile, batches: Sequence[int], widths: Sequence[int], contexts: Sequence[int]
    ) -> BatchProfiles:
        """t(B, S) priced from one row's profile as one row of B x S new tokens: t(B, S, c) = t(B * S, c).
        Either pass reads the weights once and computes on B x S tokens; what it leaves out (each row's own
        attention over its context) errs by a factor the batch learns per width from its rounds. Against
        measured batch profiles here (2 cores; int4 and fp32 1.5B, int4 0.5B; 1-8 rows, widths 1-9): 0.9-1.2x
        at 64 tokens of context, 0.5-1.4x at 512 (the widest cells overpriced). A stand-in, never stored
        (reps 0), until the engine measures the batch (engine/api.py)."""
        return cls(
            [
                BatchProfile(list(batches), list(widths), [[step(b * w, c) for w in widths] for b in batches], c, 0)
                for c in contexts
            ]
        )


def _ascending(xs, low: int) -> bool:
    return isinstance(xs, list) and bool(xs) and all(type(x) is int and x >= low for x in xs) and xs == sorted(set(xs))


def _times(table, rows: int, columns: int) -> bool:
    return (
        isinstance(table, list)
        and len(table) == rows
        and all(
            isinstance(row, list)
            and len(row) == columns
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e7 for v in row)
            for row in table
        )
    )


def well_formed(p: CostProfile | BatchProfile | BatchProfiles) -> bool:
    """Axes strictly ascending positive integers, a finite positive time in every cell."""
    if isinstance(p, BatchProfiles):
        contexts = [q.context for q in p.profiles]
        return bool(p.profiles) and all(well_formed(q) for q in p.profiles) and _ascending(contexts, 0)
    if isinstance(p, BatchProfile):
        return (
            _ascending(p.batches, 1)
            and _ascending(p.widths, 1)
            and _times(p.ms, len(p.batches), len(p.widths))
            and type(p.context) is int
            and type(p.reps) is int
        )
    return (
        isinstance(p.machine, dict)
        and isinstance(p.settings, str)
        and _ascending(p.contexts, 0)
        and _ascending(p.widths, 1)
        and _times(p.ms, len(p.contexts), len(p.widths))
        and (
            p.others_share is None
            or (isinstance(p.others_share, (int, float)) and not isinstance(p.others_share, bool))
        )
    )
