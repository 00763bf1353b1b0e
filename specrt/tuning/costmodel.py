"""Choosing k each round: expected tokens per millisecond from acceptance estimates and measured step costs.

A round that drafts k tokens costs k draft steps plus one target pass over k + 1 positions and yields
E(k) = 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens, where a_i is the probability that the i-th draft is
accepted given the ones before it were (with one constant a this is Leviathan et al.'s
(1 - a^(k+1)) / (1 - a)). The model picks the k (0 included: plain decoding) that maximises
E(k) / (k t_draft + t_target(k + 1)), with t_target from the bundle's measured cost profile, rescaled online
by what the steps actually take in this process, and the a_i learned online with exponential forgetting.

Two costs the per-round formula does not see are charged explicitly:
- Plain steps and verify passes are rescaled separately. Drafting and verifying alternate two models on the
  same cores, so a verify pass runs with caches the draft has just evicted; learning one scale from both
  would make plain decoding look as slow as that and speculation win on paper. So the target's plain steps
  measure the machine's current speed, shared by all estimates, and verify passes and draft steps learn
  how much slower (or faster) than that they run in the loop.
- A draft that sat out some rounds must first catch up on the tokens it missed (a small prefill). Starting
  to draft again is worth that only if the time it saves over the tokens still to come exceeds it; near the
  end of a generation, or when drafting barely pays, it is not.
The chosen k is a ceiling for a draft model: after each draft token, its probability under the draft
(calibrated per bucket against what the target accepted) says whether the round is worth continuing
(`keep_drafting`). The stop depends on the draft alone, so verification stays exact.
Speculation must also beat plain decoding by a margin (`min_gain`): a gain of 1% on paper is within the
error of these estimates, and a wrong bet costs more than it wins.
The module knows nothing about sessions; the speculator reports each round to it.
"""

from __future__ import annotations

from collections.abc import Callable
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


@dataclass
class MachineSpeed:
    """How fast the machine runs now against when the profiles were measured: live / profiled time of the
    target's plain 1-token steps, smoothed. One per generator, shared by the target's and the draft's costs:
    a machine that got faster or slower (clock, a neighbour's load) changes every forward, not only the kind
    last observed. (When it was learned per kind, verify and draft estimates went stale while plain decoding
    ran 30% faster than profiled, and drafting, which would have paid, never looked worth trying.)"""

    scale: float = 1.0
    source: str = "profile"  # what set the scale: "profile" (nothing yet), "wide" passes, "plain" steps
    rounds_since_plain: int = 1 << 30  # target passes since the last plain step (none yet: "forever")


@dataclass
class StepCost:
    """Milliseconds for a forward of S new tokens: a measured profile curve, times the machine's live speed,
    times a learned ratio per kind of forward (1-token "plain" steps, "wide" passes) for what the loop does
    to it (see the module docstring). The target's plain steps define the machine speed (their ratio is 1);
    until one has been seen, its wide passes do. A draft model's steps are priced relative to the same
    speed. A kind not yet seen live borrows the other kind's ratio."""

    profile: Callable[[int, int], float]  # (S, context length) -> ms, measured offline on this machine
    speed: MachineSpeed = field(default_factory=MachineSpeed)
    defines_speed: bool = True  # the target's cost; False for a draft's (CostModel ties it to the target's)
    decay: float = 0.8  # 1: frozen (tests)
    ratios: dict[str, float] = field(default_factory=dict)  # kind -> live / (profile * speed), smoothed

    @staticmethod
    def _kind(width: int) -> str:
        return "plain" if width == 1 else "wide"

    def ratio(self, kind: str) -> float:
        if self.defines_speed and kind == "plain":
            return 1.0
        other = "wide" if kind == "plain" else "plain"
        return self.ratios.get(kind, self.ratios.get(other, 1.0))

    def ms(self, width: int, context: int) -> float:
        return self.profile(width, context) * self.speed.scale * self.ratio(self._kind(width))

    def catch_up_ms(self, tokens: int, context: int) -> float:
        """A forward over `tokens` new tokens at once (a catch-up); long ones priced per 16-token chunk,
        the widest width profiles measure (profile.WIDTHS) and the cheapest per token they know."""
        chunk = min(tokens, 16)
        return self.ms(chunk, context) * tokens / chunk if tokens > 0 else 0.0

    def observe(self, width: int, context: int, ms: float) -> None:
        expected = self.profile(width, context) * self.speed.scale
        if not (expected > 0 and ms > 0):
            return
        kind = self._kind(width)
        if self.defines_speed:
            self.speed.rounds_since_plain = 0 if kind == "plain" else self.speed.rounds_since_plain + 1
        if self.defines_speed and kind == "plain" and self.speed.source != "plain" and self.decay < 1:
            # The first plain step replaces a speed inferred from wide passes through the profile's shape
            # (which can be far off in the loop): take it as measured, and keep the wide estimate, which was.
            wide = self.speed.scale * self.ratio("wide")
            self.speed.scale = ms / self.profile(width, context)
            if self.speed.source == "wide":
                self.ratios["wide"] = wide / self.speed.scale
            self.speed.source = "plain"
        elif self.defines_speed and (kind == "plain" or self.speed.source != "plain"):
            self.speed.scale = self._smooth(self.speed.scale, self.speed.scale * ms / expected)
            self.speed.source = kind
        else:
            current = self.ratio(kind)  # a kind's first observation starts from the other's ratio
            self.ratios[kind] = self._smooth(current, ms / expected)

    def _smooth(self, current: float, observed: float) -> float:
        # One odd timing (a page fault, a neighbour's burst) moves the estimate by at most 20%; a lasting
        # change of speed still wins within a few rounds.
        return self.decay * current + (1 - self.decay) * min(max(observed, 0.5 * current), 2.0 * current)


@dataclass
class CostModel:
    """k = argmax expected tokens/ms. While speculation does not pay, the acceptance estimate gets no new
    evidence, so now and then (after 8 such rounds, backing off to 256 while probes keep failing) one round
    is drafted (the fewest tokens that could pay at an optimistic acceptance, at least one): a prompt that
    turns repetitive, or a draft that is faster than believed, is noticed within a few rounds, and a prompt
    where drafting never pays spends well under 1% of its rounds on probes. A return to drafting is skipped
    when the draft's catch-up would cost more than drafting is expected to save over the rest of the
    generation; a probe, when its catch-up would cost more than `probe_budget` of the plain decoding time
    left. (A probe must not need to pay on paper: it exists because the paper may be wrong. Held to the
    saving test, a draft whose cost was once misjudged, e.g. timed while a neighbour took the cores, was
    never re-measured: every later prompt starts with the draft behind by the whole prompt.)"""

    target: StepCost
    draft: StepCost | None  # None: free proposals (n-gram lookup)
    acceptance: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)
    calibration: ConfidenceCalibration = field(default_factory=ConfidenceCalibration)
    probe_acceptance: float = 0.95
    probe_budget: float = 0.02  # a probe's catch-up may cost this share of the plain decoding time left
    # Drafting is a bet against plain decoding, so plain decoding must have been timed too: when no plain step
    # has been seen for `plain_every` rounds and drafting promises less than `plain_margin` over it, one round
    # decodes plain. Without it, a run that drafts from its first round prices plain steps from its verify
    # passes through the profile's t(2)/t(1) (1.17 for the int4 target, 1.6 measured in the loop): plain
    # decoding looked 37% slower than it was, and k = 1 at 97% acceptance ran at 0.87x. A 3x gain (fp32)
    # does not depend on that estimate and never pays for the check.
    plain_every: int | None = 32  # None: never (tests of other decisions)
    plain_margin: float = 0.3
    min_gain: float = 0.03  # drafting must promise this much more tokens/ms than plain decoding
    _idle: int = 0  # rounds in a row without drafting
    _backoff: int = 8
    _probing: bool = False

    def __post_init__(self) -> None:
        if self.draft is not None:  # the draft runs on the same machine: its costs follow the target's speed
            self.draft.speed, self.draft.defines_speed = self.target.speed, False

    def start_generation(self) -> None:
        """A new prompt: earlier acceptance becomes a light prior, and the probing schedule starts afresh
        (after a long dry spell on prose, a code prompt must not wait 256 rounds for its first probe). The
        live cost scales carry over: they describe the machine, not the text."""
        self.acceptance.rebase(3.0)
        self._idle, self._backoff, self._probing = 0, 8, False

    def tokens_per_ms(self, k: int, context: int, acceptance: float | None = None) -> float:
        draft = k * self.draft.ms(1, context) if self.draft is not None and k else 0.0
        if acceptance is None:
            expected = self.acceptance.expected_tokens(k)
        else:
            expected = sum(acceptance**i for i in range(k + 1))  # 1 + a + ... + a^k
        return expected / (draft + self.target.ms(k + 1, context))

    def _catch_up_ms(self, behind: int, context: int) -> float:
        """The draft's catch-up on the `behind` tokens it missed beyond the usual one or two."""
        return self.draft.catch_up_ms(behind, context) if self.draft is not None and behind > 2 else 0.0

    def choose(
        self, k_cap: int, context: int, behind: int = 1, remaining: int | None = None, timed: bool = True
    ) -> int:
        """The k in 0..k_cap with the most expected tokens per millisecond (0: speculation does not pay).
        behind: tokens the draft must feed before it can propose (1 when it kept up); remaining: tokens
        this generation may still produce (None: unknown, catch-ups are not weighed); timed: this round's
        passes time the target (batch 1; a batched round prices the batch, not a row, so a plain step
        taken to time plain decoding would buy nothing there)."""
        rates = {k: self.tokens_per_ms(k, context) for k in range(k_cap + 1)}
        k = max(rates, key=lambda j: (rates[j], -j))
        catch_up = self._catch_up_ms(behind, context)
        if k and not (
            rates[k] > (1 + self.min_gain) * rates[0]
            and (remaining is None or remaining * (1 / rates[0] - 1 / rates[k]) > catch_up)
        ):
            k = 0
        self._probing = False
        stale = timed and self.plain_every is not None and self.target.speed.rounds_since_plain >= self.plain_every
        if k and stale and rates[k] < (1 + self.plain_margin) * rates[0]:
            return 0  # a plain step to time (not a dry spell: no probe is due for it)
        if k == 0 and k_cap > 0:
            self._idle += 1
            if self._idle >= self._backoff:
                optimistic = {j: self.tokens_per_ms(j, context, self.probe_acceptance) for j in range(1, k_cap + 1)}
                # The fewest drafts that could pay under the optimistic acceptance, and at least one: a probe
                # also re-measures the draft's speed, so a cost that was misjudged (or has changed) cannot
                # keep speculation off for good. A probe is a bet that usually fails; a wide one would cost
                # a wide verify pass (on an int4 target t(9) is ~4 plain steps), a narrow one little more
                # than a plain step, and a success makes the next rounds draft on their own evidence.
                bar = (1 + self.min_gain) * rates[0]
                j = next((i for i in optimistic if optimistic[i] > bar), 1)
                if remaining is None or catch_up <= self.probe_budget * remaining / rates[0]:
                    k, self._probing, self._idle = j, True, 0
        elif k > 0:  # speculation pays on its own evidence: the next dry spell is probed soon again
            self._idle, self._backoff = 0, 8
        return k

    def keep_drafting(self, confidences: list[float], k: int, context: int) -> bool:
        """After drafting len(confidences) of at most k tokens (the draft's probability of each): draft another?
        The drafts so far survive verification with the calibrated probability of their confidences; going
        on to any m <= k (the later drafts at the per-position rates) must promise more tokens per
        millisecond for this round than verifying now. One unsure draft token (a name not seen before, the
        end of a line) makes the rest of the round unlikely to be accepted: the draft steps and verify width
        they would cost are saved, and rounds where the draft is sure can run longer than an average k."""
        j = len(confidences)
        if j >= k or self.draft is None:
            return j < k
        survive, expected = 1.0, 1.0
        for confidence in confidences:
            survive *= self.calibration.rate(confidence)
            expected += survive
        step = self.draft.ms(1, context)
        now = expected / (j * step + self.target.ms(j + 1, context))
        rates = self.acceptance.rates(k)
        for m in range(j + 1, k + 1):
            survive *= rates[m - 1]
            expected += survive
            if expected / (m * step + self.target.ms(m + 1, context)) > now:
                return True
        return False

    def observe(
        self,
        k: int,
        accepted: int,
        context: int,
        draft_step_ms: float | None,
        target_ms: float,
        confidences: list[float] | None = None,
        timed: bool = True,
    ) -> None:
        """One drafting round (k > 0): its acceptance, the mean time of one draft step (None: not measured),
        the time of the target's (k + 1)-token pass, and the draft's probability of each drafted token (None:
        a drafter without one); a draft after the first rejection was never tested and teaches nothing.
        timed=False: the times were of a batched round, which prices the batch, not this row's forwards."""
        self.acceptance.update(k, accepted)
        for i, confidence in enumerate((confidences or [])[: accepted + 1]):
            self.calibration.update(confidence, i < accepted)
        if self._probing:
            self._backoff = 8 if accepted == k else min(2 * self._backoff, 256)
        if not timed:
            return
        if self.draft is not None and draft_step_ms is not None:
            self.draft.observe(1, context, draft_step_ms)
        self.target.observe(k + 1, context, target_ms)
