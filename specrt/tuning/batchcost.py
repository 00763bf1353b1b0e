"""k for a whole batch: what a batched round costs, and the per-row k that maximises the batch's tokens/s.

A round over B running rows drafts k_r tokens for row r and verifies every row in one target pass. The
pass is as wide as the widest row (W = max k_r + 1: rows are padded to it), and draft position j runs one
batched step over the B_j rows still drafting, so

    cost(k) = t_target(B, W) + sum_j t_draft(B_j, 1)         gain(k) = sum_r E_r(k_r)

with E_r the expected tokens of row r (its own acceptance estimate), B in the target's term the slots the
rows' range covers (a batched run computes idle slots inside it as rows: a batch's last rows keep the slots
they had), and t(B, S) measured for this bundle on this machine (`BatchProfile`, interpolated between
measured batch sizes) at two context lengths, read
at the batch's longest row (`BatchProfiles`): the pass attends every row over that length, a cost per row
that makes a plain step of many rows dearer at long contexts and speculation relatively cheaper there
(native 1.5B, 8 rows: t(8, 2) / t(8, 1) = 1.52 at 64 tokens, 1.44 at 512). The round's rows first choose
their k as if alone (costmodel.py: probes, plain-step timing, early stops); the batch then takes the
common ceiling K on those choices that maximises gain / cost. While a batch's cores are idle between
memory-bound steps, verify costs little and every row drafts its own k; as rows fill the cores, t(B, W)
grows with B * W and K falls, to 0 (plain batching) when speculation would spend compute that batching
needs. The ceiling moves only when the new one promises `margin` more tokens/s than the current one, so
a batch near the break-even point does not thrash between two values from round to round.

A row's own k prices a pass as wide as its own drafts; in a batch the pass is as wide as the widest row
whatever the others draft, so a row drafting fewer tokens may draft on towards the widest row's k for only its
share of draft steps that run anyway: each such row, the most promising first, rides up to it (as far as its
drafter can) wherever that raises the round's rate (`ride`), and stops when the rows it rides with stop, so it
never widens the pass on its own (`BatchChoice.riders`; runner.py). Without it, 2 fp32 rows at T = 0 (a code
row drafting 8, a prose row 3-5 as if alone, stopping early at 3 of 7) ran their batched rounds at 0.98 of fixed
k = 5's tokens/s and auto / best fixed read 0.940; with it 0.995 and 1.004 (results/trust/batch-bookkeeping,
results/trust/batch-s32-riders).

A row whose draft sat out output tokens (the batch's plain rounds) must feed them to it before it drafts
again: a round that makes such a row draft is charged that catch-up in full (`catch_up[r]`, priced by the
row's cost model; `weigh_missed`), and the row sits the round out where that costs the batch more than it
adds. It is the price of switching drafting back on: spread over rounds it would be paid again at every
switch, and a batch near break-even switched back and forth (int4 pair, 2 rows: 40 plain and 51 drafting
rounds at 0.74x of plain batching; results/trust/missed). A prompt's catch-up is not charged (every row
starts with one: charged, the batch never began to draft).

A row the ceiling keeps from drafting at all teaches nothing about its acceptance, so an estimate that is
too low for the batch (a prior from a request of another kind, one unlucky round) would never be corrected:
int4 pair, 2 rows of code prompts after prose ones, k = 0 in 251 of 252 row-rounds where k = 3 ran 1.37x
faster than plain batching (results/trust/batch-idle-measure). So the batch probes: in a round that keeps
rows wanting to draft (on their estimates, or for their own probe: costmodel.py) from drafting, when its
probe is due, those rows and every other auto row that chose not to draft (the pass is widened for all of
them anyway, and their estimates may be as wrong) draft the fewest tokens under which the round would beat
the plain one by the margin a ceiling needs to move if their drafts were accepted as a probe hopes
(`probe_acceptance`: where even that would not move the ceiling, a probe teaches the choice nothing; a
row may draft more than the k it chose, which rests on the estimate being tested), and
only where the catch-ups it makes them pay stay within `probe_budget` of the batch's plain decoding time
left; where drafting could not pay even then (many rows of compute-bound passes) no probe runs. A probe gets
dearer with every plain round (each adds a token to every row's catch-up, about 5 ms per row for the int4
0.5B draft), so the batch's schedule is not a row's: the first probe comes at the first such round after a
row joins the batch, the next at once while probes come back fully accepted (a run of them teaches an
estimate what one cannot, and costs no catch-up), `probe_after` rounds after a rejection, doubling to
`max_backoff` while they fail.

The profile is corrected from the rounds the batch runs: per pass shape, the slots it computes B and its width
W, the measured time of its rounds against the profile's prediction, smoothed (`ratios`). One ratio for all
widths would only follow the machine's drift and leave the choice where it was (a common factor cancels in the
argmax); per width it learns what the choice needs, how much a wider round really costs against a narrower
one on this machine now. And per B, because the profile's error is not the same at every batch size: a
served native pair's plain rounds ran at 1.4x the profile with 4 rows and at 1.0x with 8, and with one ratio
per width the 4-row figure priced 8-row plain rounds at 120 ms against 85 measured, so 8 rows drafted for 90
rounds at 0.89x of plain batching (results/trust/serve-shape-ratio). A width not run at B reads the line
through the widths run at B; at a B with nothing run, the line of the nearest B that has some. A shape the
batch does not run is not learned, so now and then a round runs at a neighbour of the best ceiling (K - 1 or
K + 1) to time it: a neighbour timed better becomes the best, and so on. What a timing costs is known by the
prices in force (a round at the neighbour instead of the best loses a share of a round's tokens), and
`explore_budget` (1%) of the batch's tokens pays for it, so a neighbour is timed again once untimed for that
share / 1% rounds (never sooner than `explore_every`, 8): one priced near the best, whose price decides the
choice, within a few rounds; one far below it rarely. A fixed schedule (one round in 16 at a neighbour untimed
for 32) left the plain shape of an int4 pair's 2 rows priced at 1.33x (slow plain rounds earlier) through 48
drafting rounds, k = 1 looking 7% better than plain where plain was 10% better (auto at 0.82x plain batching:
results/trust/batch-s29-int4); priced 11% below k = 1, plain is now timed again after 11 rounds. What a shape
learned fades by `decay` per round, timed or not: a shape timed every round is smoothed over about five, and
one timed again after a while is taken as measured, near enough (this machine slows down for seconds at a
time, and a width priced at such a spell must not keep it: 2 fp32 rows at T = 0.7, four rounds at 2x moved
width 5's ratio 1.03 -> 1.40, and a width timed again only after 256 rounds kept it: results/trust/batch-stale).
A shape's first round in the engine is not learned from: ONNX Runtime's first run of a new shape is cold (2
fp32 rows at width 9: 298 ms, then ~250 warm), and taken as measured it priced every wide round dear (the line
through the ratios) for the rest of the batch (results/trust/batch-c2-trace). Its second is taken as
measured.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .costmodel import Policy
from .profile import BatchProfile, BatchProfiles


def shape(ks: Sequence[int], span: int | None = None) -> tuple[int, int]:
    """The target pass of a round at these k: (the slots it computes, its width). A batched run computes every
    slot of its rows' range, idle ones as rows (`span`), and pads every row to the widest."""
    return max(len(ks), span or 0), max(ks) + 1


@dataclass(frozen=True)
class BatchChoice:
    """The round's ceiling K and each row's k under it."""

    ceiling: int
    ks: list[int]
    explore: bool = False  # a round at an untimed width, to time it (the ceiling in force stays)
    probed: tuple[int, ...] = ()  # rows the ceiling kept from drafting that draft a little to test acceptance
    starved: bool = False  # the ceiling keeps a row that wants to draft from drafting at all
    riders: tuple[int, ...] = ()  # rows drafting past their own k towards the widest row's (see `choose`)


@dataclass
class BatchCost:
    target: BatchProfiles | BatchProfile  # a single profile is read at its one context
    draft: BatchProfiles | BatchProfile | None
    # A new ceiling must promise this much more tokens/s than the current one: on acceptance estimates
    # wobbling at break-even (test_k_for_the_batch_does_not_flap) 3% switched once in 199 rounds, 2% 10
    # times; 5% held an int4 pair's 2 rows at K = 1 where K = 3 promised 4.5% more (and ran 5-10% faster).
    margin: float = 0.03
    weigh_missed: bool = True  # charge a row's catch-up on output tokens its draft sat out (see above)
    decay: float = 0.8
    ratios: dict[tuple[int, int], float] = field(default_factory=dict)  # (B, W) -> live / profiled time, smoothed
    policy: Policy = Policy()  # the probing rule (probe_after, max_backoff, probe_acceptance, probe_budget)
    explore_every: int = 8  # the fewest rounds before a width is timed again (`_due`)
    explore_budget: float = 0.01  # the share of the batch's tokens a neighbour's timing may cost (`_due`)
    ceiling: int | None = None  # the K in force
    rounds: int = 0  # batched rounds observed
    timed: dict[tuple[int, int], int] = field(default_factory=dict)  # (B, W) -> the round it was last timed in
    warm: set[tuple[int, int]] = field(default_factory=set)  # pass shapes (B, W) the engine has run (cold first)
    history: list[int] = field(default_factory=list)  # K per batched round (for the no-flapping check)
    starved_rounds: int = 0  # rounds since the last probe that kept rows wanting to draft from drafting
    wait: int = 1  # such rounds before the next probe (see the module docstring)

    def __post_init__(self) -> None:
        if isinstance(self.target, BatchProfile):
            self.target = BatchProfiles([self.target])
        if isinstance(self.draft, BatchProfile):
            self.draft = BatchProfiles([self.draft])

    def round_ms(
        self,
        ks: Sequence[int],
        drafting: Sequence[bool] | None = None,
        context: int | None = None,
        span: int | None = None,
    ) -> float:
        """Predicted milliseconds of a round with these k (drafting[r]: row r's drafts come from the draft
        model; prompt lookup's are free) when the longest row holds `context` tokens and the rows' slots span
        `span` slots (the target pass computes every slot of the range, idle ones as rows; None: no gaps)."""
        drafting = drafting if drafting is not None else [True] * len(ks)
        slots, width = shape(ks, span)
        ms = self.target(slots, width, context)
        if self.draft is not None:
            for j in range(1, width):
                rows = sum(1 for k, d in zip(ks, drafting, strict=True) if d and k >= j)
                ms += self.draft(rows, 1, context) if rows else 0.0
        return ms * self.ratio(slots, width)

    def ratio(self, slots: int, width: int) -> float:
        """Live / profiled time of rounds whose pass computes `slots` rows `width` wide: learned; else from the
        widths learned at that many slots (at the nearest count that has some, where none): from two or more,
        the straight line through them (a profile that misjudges the cost of width misjudges it in
        proportion, more or less), kept within half the smallest and twice the largest learned ratio; from
        one, that one; from none, 1."""
        if (slots, width) in self.ratios:
            return self.ratios[slots, width]
        counts = {b for b, _ in self.ratios}
        near = min(counts, key=lambda b: (abs(b - slots), -b), default=slots)
        learned = {w: r for (b, w), r in self.ratios.items() if b == near}
        if len(learned) < 2:
            return learned.get(width, next(iter(learned.values()), 1.0))
        xs, ys = list(learned), list(learned.values())
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        return min(max(my + slope * (width - mx), 0.5 * min(ys)), 2.0 * max(ys))

    def choose(
        self,
        wanted: Sequence[int],
        expected: Sequence[Callable[[int], float]],
        fixed: Sequence[bool],
        drafting: Sequence[bool],
        context: int | None = None,
        catch_up: Sequence[float] | None = None,
        left: int | None = None,
        room: Sequence[int] | None = None,
        span: int | None = None,
    ) -> BatchChoice:
        """Per-row k for the round: each auto row's own choice, capped at the ceiling K that maximises the
        batch's expected tokens per millisecond, and raised towards the widest row's k where that pays (`ride`).
        Fixed-k rows keep their k (it still widens the pass).
        catch_up[r]: milliseconds row r's draft needs for output tokens it sat out before it can draft;
        left: rounds the batch may still run (its longest row's tokens left; None: unknown, a probe may make
        no row catch up); room[r]: the most drafts row r could make this round (a probe may go past the k it
        chose: its estimate is what the probe tests; a row may ride towards the widest row's k; None: neither
        beyond a row's own k, where a probe holds at it); span: the slots the rows' range covers (`round_ms`).
        A query: the ceiling in force changes only when the round is observed."""

        if all(fixed):  # nothing to cap: the one candidate, without pricing it (this runs every round)
            return BatchChoice(0, list(wanted))
        catch_up = catch_up if catch_up is not None and self.weigh_missed else [0.0] * len(wanted)
        # Every ceiling's candidate and every rider's step is priced from the same few numbers: each row's E(k)
        # and each k vector's round time are read once (16 rows wanting 3-7: 3.3 ms a call priced afresh, 1.1 read
        # once; results/trust/riders-ab).
        expected = [functools.cache(e) for e in expected]
        priced = functools.cache(lambda ks: self.round_ms(ks, drafting, context, span))

        def round_ms(ks: list[int]) -> float:
            return priced(tuple(ks))

        def switching_ms(ks: list[int]) -> float:  # the catch-ups a round at these k must pay first
            return sum(c for k, d, c in zip(ks, drafting, catch_up, strict=True) if k and d)

        def rate(ks: list[int], gains: Sequence[Callable[[int], float]] = expected, switching: bool = True) -> float:
            gain = sum(e(k) for e, k in zip(gains, ks, strict=True))
            return gain / (round_ms(ks) + (switching_ms(ks) if switching else 0.0))

        def ks_for(ceiling: int) -> list[int]:
            ks = [w if f else min(w, ceiling) for w, f in zip(wanted, fixed, strict=True)]
            for r, c in enumerate(catch_up):  # a row whose catch-up costs the batch more than it adds sits out
                if c and ks[r] and not fixed[r] and rate(without := ks[:r] + [0] + ks[r + 1 :]) > rate(ks):
                    ks = without
            return ride(ks)

        def ride(ks: list[int]) -> list[int]:
            """Auto rows drafting fewer tokens than the widest row draft on towards its k, one row at a time
            (the most promising first), wherever that raises the round's rate: the pass is as wide as the
            widest row whatever they draft, so a row's extra drafts cost only its share of batched draft steps
            that run anyway. A row's own k prices a pass of its own width; in a batch that pass is paid."""
            width = max(ks, default=0)
            if not width or room is None:
                return ks
            up = {
                r: min(room[r], width)
                for r, k in enumerate(ks)
                if 0 < k < width and not fixed[r] and drafting[r] and room[r] > k
            }
            for r in sorted(up, key=lambda r: expected[r](up[r]) - expected[r](ks[r]), reverse=True):
                if rate(raised := ks[:r] + [up[r]] + ks[r + 1 :]) > rate(ks):
                    ks = raised
            return ks

        def riding(ks: list[int], ceiling: int) -> tuple[int, ...]:
            return tuple(
                r for r, (k, w, f) in enumerate(zip(ks, wanted, fixed, strict=True)) if not f and k > min(w, ceiling)
            )

        top = max((w for w, f in zip(wanted, fixed, strict=True) if not f), default=0)
        ks_at = {k: ks_for(k) for k in range(top + 1)}  # each ceiling's per-row k, priced once
        candidates = {k: rate(ks) for k, ks in ks_at.items()}
        best = max(candidates, key=lambda k: (candidates[k], -k))
        current = self.ceiling if self.ceiling is not None and self.ceiling in candidates else None
        if current is not None and candidates[current] * (1 + self.margin) >= candidates[best]:
            best = current  # not enough better to move
        chosen = ks_at[best]
        starved = [r for r, (w, k, f) in enumerate(zip(wanted, chosen, fixed, strict=True)) if w and not k and not f]
        if starved and self.policy.probe_after is not None and self.starved_rounds + 1 >= self.wait:
            # The probe: every auto row held at 0 drafts (the pass is widened for all anyway, and an estimate
            # that kept a row from drafting even alone may be as wrong as the others'): the fewest drafts (a
            # ceiling over those rows) under which the round would beat this one by the margin a ceiling
            # needs to move if they were accepted as hoped, its catch-ups aside (where the best outcome
            # would not move the ceiling, a probe teaches nothing the choice needs); then only within the
            # probe's budget of the plain decoding left.
            most = room or [0] * len(wanted)
            can = [max(w, m) if not f and not k else 0 for w, m, f, k in zip(wanted, most, fixed, chosen, strict=True)]
            hoped = [self._hoped if c else e for c, e in zip(can, expected, strict=True)]
            bar = rate(chosen, hoped, switching=False) * (1 + self.margin)  # what would move the ceiling
            budget = self.policy.probe_budget * (left or 0) * round_ms(chosen)
            for k in range(1, max(can) + 1):
                ks = [min(c, k) if c else x for c, x in zip(can, chosen, strict=True)]
                if rate(ks, hoped, switching=False) > bar:
                    if switching_ms(ks) <= budget:
                        probed = tuple(r for r, c in enumerate(can) if c)
                        return BatchChoice(best, ks, probed=probed, starved=True, riders=riding(chosen, best))
                    break  # wider probes pay the same catch-ups

        def lost(k: int) -> float:  # a round at ceiling k instead of the best: the best's rounds of tokens lost
            ms, best_ms = (round_ms(ks) for ks in (ks_at[k], chosen))
            return ms * (candidates[best] - candidates[k]) / (best_ms * candidates[best])

        if self.timed:
            # Only the best's neighbours: enough to climb (a neighbour timed better becomes the best, and its
            # own neighbour is timed next), and never a wide round far from the best (timing every width, 8
            # rows at widths up to 9, cost 7% of plain batching's tokens/s). Each when its timing is due (`_due`).
            due = [
                k
                for k in (best - 1, best + 1)
                if k in candidates
                and self._due(shape(ks_at[k], span), lambda k=k: lost(k))
                and not switching_ms(ks_at[k])  # timing a width must not pay a catch-up
            ]
            if due:
                k = max(due, key=lambda k: candidates[k])  # the nearer to the best first
                return BatchChoice(k, ks_at[k], explore=True, starved=bool(starved), riders=riding(ks_at[k], k))
        return BatchChoice(best, chosen, starved=bool(starved), riders=riding(chosen, best))

    def _due(self, key: tuple[int, int], lost: Callable[[], float]) -> bool:
        """Is a round at this pass shape due to be timed, where running it instead of the best costs the batch
        lost() of a round's tokens by the prices in force? `explore_budget` of the batch's tokens pays for
        timing it, so it is due once untimed for lost() / explore_budget rounds, and never sooner than
        `explore_every`: a neighbour near the best (whose price decides the choice) within a few rounds, one far
        below it rarely. (lost() prices two rounds: asked only once `explore_every` has passed.)"""
        untimed = self.rounds - self.timed.get(key, -(1 << 30))
        return untimed >= self.explore_every and untimed >= lost() / self.explore_budget

    def _hoped(self, k: int) -> float:
        """Expected tokens of k drafts at the acceptance a probe hopes for."""
        return sum(self.policy.probe_acceptance**i for i in range(k + 1))

    def observe(
        self,
        choice: BatchChoice,
        drafted: Sequence[int] = (),
        drafting: Sequence[bool] | None = None,
        context: int | None = None,
        measured_ms: float = 0.0,
        accepted: Sequence[int] = (),
        span: int | None = None,
    ) -> None:
        """A batched round ran under `choice`, drafted `drafted[r]` tokens per row (early stops may draft
        fewer than chosen) and had `accepted[r]` of them accepted, in `measured_ms`: its ceiling is now the
        one in force; a probe whose drafts were all accepted makes the next one come as soon as the policy
        allows, one with a rejection doubles the wait; its time against the profile's sets the ratio of its
        pass shape (slots, width): none from the engine's first round of a shape (a cold run), the first timing
        after it as measured, later ones weighted by how long the shape went untimed (`decay` per round: a
        shape running every round is smoothed, one disturbed round must not swing the choice) and by at most
        2x of itself."""
        if not choice.explore:
            self.ceiling = choice.ceiling
        self._schedule_probes(choice, drafted, accepted)
        self.history.append(choice.ceiling)
        del self.history[:-1000]
        self.rounds += 1
        if not drafted or measured_ms <= 0:
            return
        key = shape(drafted, span)
        if key not in self.warm:  # cold: untimed still, so the shape's next round is its first timing
            self.warm.add(key)
            return
        learned = key in self.ratios
        age = self.rounds - self.timed.get(key, 0)  # rounds since it was last timed (read where learned)
        self.timed[key] = self.rounds
        current = self.ratio(*key)
        profiled = self.round_ms(drafted, drafting, context, span) / current
        if profiled <= 0:
            return
        if not learned:  # its first timing, as measured: what it borrowed was a guess
            self.ratios[key] = measured_ms / profiled
        else:  # what it learned fades by `decay` per round, run or not (a width timed long ago: as measured)
            bounded = min(max(measured_ms / profiled, 0.5 * current), 2.0 * current)
            weight = self.decay**age
            self.ratios[key] = weight * current + (1 - weight) * bounded

    def joined(self) -> None:
        """A row joined the batch: its draft has nothing to catch up on yet and its acceptance is a prior,
        so the next round that keeps rows from drafting probes."""
        self.wait, self.starved_rounds = 1, 0

    def _schedule_probes(self, choice: BatchChoice, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """The probing schedule (module docstring): starved rounds count towards the next probe; a probe's
        outcome sets the wait; rows drafting without a probe mean drafting pays on its own evidence, and the
        next dry spell starts with its drafts caught up, so it is probed at once."""
        if choice.probed:  # (only under a policy that probes)
            self.starved_rounds = 0
            full = bool(accepted) and all(accepted[r] == drafted[r] for r in choice.probed)
            after, most = self.policy.probe_after, self.policy.max_backoff
            self.wait = 1 if full else min(max(2 * self.wait, after), most)
        elif choice.starved:
            self.starved_rounds += 1
        elif any(drafted):
            self.starved_rounds, self.wait = 0, 1
