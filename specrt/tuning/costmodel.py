"""Choosing k each round: expected tokens per millisecond from acceptance estimates and step costs.

A round that drafts k tokens costs k draft steps plus one target pass over k + 1 positions and yields
E(k) = 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens, where a_i is the probability that the i-th draft is
accepted given the ones before it were (with one constant a this is Leviathan et al.'s
(1 - a^(k+1)) / (1 - a)). `CostModel.choose` picks the k (0 included: plain decoding) that maximises
E(k) / (k t_draft + t_target(k + 1)), with the step costs of stepcost.py and the a_i of acceptance.py.

Deciding and learning are apart: `choose` and `keep_drafting` are queries (same state, same answer), and
everything a round teaches goes through `RequestCosts.observe(outcome)`, once per round. Around the
argmax, the `Policy` holds the rules that keep the estimates honest; each stays because a benchmark shows
it pays (removing it costs more than 3% of tokens/s on the real pair: results/layout/ablation-*.md):
- **probes**: while speculation does not pay, acceptance gets no evidence, so after `probe_after` such
  rounds (backing off to `max_backoff` while probes fail) one round drafts the fewest tokens that could pay
  at an optimistic acceptance, at least one: a prompt that turns repetitive, or a draft that is faster than
  believed, is noticed, and a prompt where drafting never pays spends well under 1% of its rounds on probes;
  a probe whose drafts were all accepted is followed by another at once (a run of them costs no catch-up);
- **timing plain decoding**: drafting is a bet against plain decoding, so when no plain step has been timed
  for `plain_every` rounds and drafting promises less than `plain_margin` over it, one round decodes plain
  (a run that drafts from its first round otherwise prices plain steps from verify passes through the
  profile's t(2)/t(1): 1.17 profiled, 1.6 in the loop for the int4 target; k = 1 at 97% ran at 0.87x);
- **widening** (`widen_every`): rounds time only what they run, so a request drafting k = 1 knows one verify
  width and one draft step, and prices every other k from them and the profile. Once no pass of the widest
  width a round may reach (k + `stretch` + 1) has been timed for `widen_every` target passes, a round alone
  drafts its whole ceiling, the early stop off: it times that width and the later draft steps, and tests
  positions past k (int4 pair on a Zen 3 CPU at one stream: auto stayed at k = 1 where k = 3 ran 1.07-1.25x
  faster, k = 3 priced 11% dear from k = 1 rounds; results/trust/batch-s26-avx2);
- **early stop** (`keep_drafting`): the chosen k is a ceiling for a draft model; after each draft token, its
  calibrated confidence says whether going on promises more than verifying now. It depends on the draft
  alone, so verification stays exact. A round that runs alone may go `stretch` (2) past the chosen k while
  the draft is that sure: positions past k get evidence, where otherwise they follow a_1 for good
  (bench_batch's code prompts at one stream: auto / best fixed k 0.84-0.92 without, 0.95-1.03 with);
- **the draft's missed tokens** (`weigh_missed`): a row whose draft sat out rounds of its generation (the
  plain rounds of a batch) must feed it every output token it missed before drafting again; drafting must
  save more than that over the tokens left (a probe: cost at most `probe_budget` of the plain decoding time
  left, or `probe_share` of what drafting would save there at the hoped acceptance: a short request under a
  pessimistic prior still probes once; drafting that pays per round but not its catch-up is a dry spell like
  any other, so such a probe may end it). It keeps a row that finishes its batch alone from paying a draft
  prefill of its whole output for its last few tokens. The entry fee of any drafting is not weighed: a
  request's first drafting round feeds its draft the prompt and the output it decoded alone until then (the
  scheduler leaves both out of `missed`), and weighing them against one generation's savings estimated from
  a prior kept fresh requests from ever drafting, so never learning (the prompt: results/trust/catch-up,
  0.82x at one row; the output of the dry spell before a first probe: results/trust/probe-stake).
A rule was measured not to pay and is gone: a 3% margin drafting had to promise over plain decoding (within
1% on the int4 and native pairs, 8 prompts).
This module knows nothing about sessions or the scheduler: it is handed numbers and asked questions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from .acceptance import AcceptanceEstimate, ConfidenceCalibration
from .stepcost import DRAFT, TARGET, StepCosts

MODEL, NGRAM = "model", "ngram"  # the drafters


@dataclass(frozen=True)
class Policy:
    """The decision rule's constants (see the module docstring for why each exists)."""

    probe_after: int | None = 8  # idle rounds before the first probe (None: never probe)
    max_backoff: int = 256
    probe_acceptance: float = 0.95
    plain_every: int | None = 32  # None: never decode plain just to time it
    plain_margin: float = 0.3
    widen_every: int | None = 32  # None: never widen a round just to time a wider pass
    early_stop: bool = True
    weigh_missed: bool = True
    probe_budget: float = 0.02  # a probe may spend this share of the plain decoding time left catching up
    probe_share: float | None = 0.2  # ... or this share of what drafting would save there at probe_acceptance
    stretch: int = 2  # alone, a model draft may go this far past the chosen k while the early stop says it pays


@dataclass(frozen=True)
class Choice:
    """One drafter's answer for a round: k, why, the tokens per ms it promises (0 when k is 0), and how far
    past k the early stop may take the draft (`Policy.stretch`)."""

    k: int
    why: str  # "pays", "probe", "idle" (does not pay), "timing" (a plain step to time), "none" (k_cap 0),
    # "behind" (pays per round, not its draft's catch-up over the tokens left), "widen" (pays, and drafts its
    # whole ceiling to time a wider pass: the early stop is off for the round)
    rate: float = 0.0
    stretch: int = 0

    @property
    def ceiling(self) -> int:
        """The most tokens this drafter may propose this round."""
        return self.k + self.stretch


@dataclass(frozen=True)
class Outcome:
    """What one row's round did, for learning: who drafted how many, how many were accepted, and the times
    (of this row's forwards only when the round ran alone)."""

    drafter: str | None  # MODEL, NGRAM or None (a plain step)
    k: int
    accepted: int
    context: int  # tokens before the round
    alone: bool
    target_ms: float
    draft_step_ms: float | None = None  # mean time of one draft step (None: not measured)
    confidences: tuple[float, ...] = ()  # the draft's probability of each drafted token
    catch_up: tuple[int, float] = (0, 0.0)  # tokens the draft was fed before its first step (missed ones), ms
    draft_first_ms: float | None = None  # the round's first draft step (None: not measured apart)


class CostModel:
    """One request's k for one drafter: the engine's step costs (shared), its own acceptance, its own
    probing schedule."""

    def __init__(
        self,
        steps: StepCosts,
        drafter: str = MODEL,
        acceptance: AcceptanceEstimate | None = None,
        calibration: ConfidenceCalibration | None = None,
        policy: Policy = Policy(),
    ):
        self.steps, self.drafter, self.policy = steps, drafter, policy
        self.acceptance = acceptance if acceptance is not None else AcceptanceEstimate()
        self.calibration = calibration if calibration is not None else ConfidenceCalibration()
        self.idle = 0  # rounds in a row that did not draft because it does not pay
        self.backoff = policy.probe_after  # idle rounds before the next probe
        self.again = False  # the last round was a probe whose drafts were all accepted: probe again at once

    # ------------------------------------------------------------------ queries

    def draft_ms(self, k: int, context: int) -> float:
        """A round's k draft steps (prompt lookup is free)."""
        return self.steps.draft_round_ms(k, context) if self.drafter == MODEL else 0.0

    def tokens_per_ms(self, k: int, context: int, acceptance: float | None = None) -> float:
        if acceptance is None:
            expected = self.acceptance.expected_tokens(k)
        else:
            expected = sum(acceptance**i for i in range(k + 1))  # 1 + a + ... + a^k
        return expected / (self.draft_ms(k, context) + self.steps.ms(TARGET, k + 1, context))

    def choose(
        self, k_cap: int, context: int, alone: bool = True, missed: int = 0, remaining: int | None = None
    ) -> Choice:
        """The k in 0..k_cap with the most expected tokens per millisecond (0: speculation does not pay).
        alone: the round runs at batch 1, so its passes time the target (a batched round prices the batch,
        not a row: a plain step taken there to time plain decoding would buy nothing); missed: output tokens
        the draft sat out and must be fed before it can propose; remaining: tokens this generation may still
        produce (None: unknown, the catch-up is not weighed)."""
        policy = self.policy
        if k_cap <= 0:
            return Choice(0, "none")
        rates = {k: self.tokens_per_ms(k, context) for k in range(k_cap + 1)}
        k = max(rates, key=lambda j: (rates[j], -j))  # ties: the smaller k
        catch_up = self.catch_up_ms(missed, context) if remaining is not None else 0.0
        behind = bool(k and catch_up and remaining * (1 / rates[0] - 1 / rates[k]) <= catch_up)
        if behind:  # pays per round, not its catch-up: a dry spell like any other, which a probe may end
            k = 0
        if k:
            stale = alone and policy.plain_every is not None and self.steps.since_timed(1) >= policy.plain_every
            if stale and rates[k] < (1 + policy.plain_margin) * rates[0]:
                return Choice(0, "timing")
            stretch = self._stretch(k, k_cap, alone)
            wide = k + stretch + 1  # the widest pass this round may run
            if stretch and policy.widen_every is not None and self.steps.since_timed(wide) >= policy.widen_every:
                return Choice(k, "widen", rates[k], stretch)
            return Choice(k, "pays", rates[k], stretch)
        if self.backoff is not None and (self.again or self.idle + 1 >= self.backoff):
            hoped = {j: self.tokens_per_ms(j, context, policy.probe_acceptance) for j in range(1, k_cap + 1)}
            if catch_up and catch_up > self._probe_stake(hoped, rates[0], remaining):
                return Choice(0, "behind")
            j = self._probe_width(hoped, rates[0])
            return Choice(j, "probe", rates[j])
        return Choice(0, "behind" if behind else "idle")

    def _probe_stake(self, hoped: dict[int, float], plain_rate: float, remaining: int) -> float:
        """The most a probe may spend catching its draft up (a probe must stay a small bet): `probe_budget` of
        the plain decoding time left, or `probe_share` of what drafting would save over it at the acceptance a
        probe hopes for, whichever is more. A refused probe is refused for the rest of the request (each plain
        round adds a token to the catch-up and takes one from the tokens left), and a request that never
        drafts hands its prior on unchanged: with the budget alone, 64-token requests under a prior of 0.69
        were refused at their first due probe (7 missed tokens priced above 2% of 56 plain steps) and a
        server never drafted again (results/trust/probe-stake). The saving side lets a short request probe
        once where drafting could pay; where it could not even at the hoped acceptance it adds nothing, and
        the budget still lets probes re-measure a cost that was misjudged. Unlike the other rules it is kept
        for the trap it removes, not a measured speed-up: on a CPU where the int4 pair is at break-even it was
        speed-neutral (new / old 0.98-1.01), while 16 of 16 requests drafted against 1 of 16."""
        plain = remaining / plain_rate
        stake = self.policy.probe_budget * plain
        if self.policy.probe_share:
            stake = max(stake, self.policy.probe_share * (plain - remaining / max(hoped.values())))
        return stake

    def _stretch(self, k: int, k_cap: int, alone: bool) -> int:
        """How far past a chosen k a model draft alone may go, where its confidence says going on pays
        (`keep_drafting`). Positions past k are otherwise never tested, so they follow the estimate before
        them: on code at T = 0.7 a_1 read ~0.9 while positions 2-5 accepted ~0.97, and k = 1 looked best
        where k = 5 ran 1.25x faster (results/trust/acceptance-stretch). In a batch the ceiling prices the
        rows' widths, so a row drafts at most its k there."""
        if alone and self.drafter == MODEL and self.policy.early_stop:
            return min(self.policy.stretch, k_cap - k)  # k <= k_cap: the argmax is taken over 0..k_cap
        return 0

    def catch_up_ms(self, missed: int, context: int) -> float:
        """The draft's forward over the output tokens it missed (0 when the rule is off or it kept up)."""
        if self.drafter != MODEL or missed <= 0 or not self.policy.weigh_missed:
            return 0.0
        return self.steps.catch_up_ms(missed, context)

    @staticmethod
    def _probe_width(hoped: dict[int, float], bar: float) -> int:
        """The fewest drafts that could pay under the optimistic acceptance (`hoped`: tokens per ms per k at
        `probe_acceptance`), and at least one: a probe also
        re-measures the draft's speed, so a cost that was misjudged (or has changed) cannot keep
        speculation off for good. A probe is a bet that usually fails; a wide one would cost a wide verify
        pass (on an int4 target t(9) is ~4 plain steps), a narrow one little more than a plain step."""
        return next((j for j, rate in hoped.items() if rate > bar), 1)

    def keep_drafting(self, confidences: list[float], k: int, context: int) -> bool:
        """After drafting len(confidences) of at most k tokens (the draft's probability of each): draft another?
        The drafts so far survive verification with the calibrated probability of their confidences; going
        on to any m <= k (the later drafts at the per-position rates) must promise more tokens per
        millisecond for this round than verifying now. One unsure draft token (a name not seen before, the
        end of a line) makes the rest of the round unlikely to be accepted: the draft steps and verify width
        they would cost are saved, and rounds where the draft is sure can run longer than an average k."""
        j = len(confidences)
        if j >= k or self.drafter != MODEL or not self.policy.early_stop:
            return j < k
        survive, expected = 1.0, 1.0
        for confidence in confidences:
            survive *= self.calibration.rate(confidence)
            expected += survive
        now = expected / (self.draft_ms(j, context) + self.steps.ms(TARGET, j + 1, context))
        rates = self.acceptance.rates(k)
        for m in range(j + 1, k + 1):
            survive *= rates[m - 1]
            expected += survive
            if expected / (self.draft_ms(m, context) + self.steps.ms(TARGET, m + 1, context)) > now:
                return True
        return False

    # ------------------------------------------------------------------ learning

    def observe(self, choice: Choice, outcome: Outcome | None) -> None:
        """This drafter chose `choice`; `outcome` is the round it drafted (None: another drafter drafted, or
        the batch's ceiling cut it to nothing). Drafts after the first rejection were never tested and teach
        nothing."""
        self.again = False
        if choice.why in ("idle", "behind"):  # behind: a dry spell too (the next probe still weighs its catch-up)
            self.idle += 1
        elif choice.why in ("pays", "widen", "probe"):
            self.idle = 0
            if choice.why != "probe":  # speculation pays on its own evidence: probe the next dry spell soon
                self.backoff = self.policy.probe_after
        if outcome is None or outcome.k == 0:
            return
        self.acceptance.update(outcome.k, outcome.accepted)
        for i, confidence in enumerate(outcome.confidences[: outcome.accepted + 1]):
            self.calibration.update(confidence, i < outcome.accepted)
        if choice.why == "probe" and self.backoff is not None:
            # A probe whose drafts were all accepted is followed at once by another, while the estimate is below
            # what a probe hopes for: its draft is caught up, so the next costs no catch-up, and a run of them
            # moves an estimate that one cannot (one accepted probe moved a_1 from 0.77 to 0.81 where k = 1
            # paid from about 0.85; eight plain rounds later the catch-up was too dear to probe again, and a
            # code prompt at 93% acceptance ran plain to its end). Above the hope a run teaches acceptance
            # nothing (drafting then loses on its costs, which one probe per dry spell re-measures). A run that
            # ends in a rejection doubles the wait, as one failed probe does.
            full = outcome.accepted == outcome.k
            self.again = full and self.acceptance.rate(0) < self.policy.probe_acceptance
            if not full:
                self.backoff = min(2 * self.backoff, self.policy.max_backoff)


class RequestCosts:
    """One request's cost models, one per drafter that may draft for it, over the engine's shared `Tuning`."""

    def __init__(self, tuning: Tuning, models: dict[str, CostModel]):
        self.tuning, self.models = tuning, models

    def get(self, drafter: str | None) -> CostModel | None:
        return self.models.get(drafter) if drafter else None

    def observe(self, choices: dict[str, Choice], outcome: Outcome) -> None:
        """Everything one round teaches: the step costs (a round that ran alone), then each drafter's
        acceptance and probing schedule."""
        steps = self.tuning.steps
        if outcome.alone and steps is not None:
            if outcome.drafter == MODEL and outcome.k and outcome.draft_step_ms is not None:
                self._observe_draft(outcome)
            steps.observe(TARGET, outcome.k + 1, outcome.context, outcome.target_ms)
            fed, catch_up_ms = outcome.catch_up
            if outcome.drafter == MODEL and fed > 0:
                steps.observe_catch_up(fed, outcome.context, catch_up_ms)
        for name, choice in choices.items():
            self.models[name].observe(choice, outcome if outcome.drafter == name else None)

    def _observe_draft(self, outcome: Outcome) -> None:
        """The round's draft steps: the first apart from the later ones (their mean), where timed apart."""
        steps, k, first, mean = self.tuning.steps, outcome.k, outcome.draft_first_ms, outcome.draft_step_ms
        if first is None:
            steps.observe(DRAFT, 1, outcome.context, mean)
            return
        steps.observe(DRAFT, 1, outcome.context, first, first=True)
        if k > 1:
            steps.observe(DRAFT, 1, outcome.context, (k * mean - first) / (k - 1))

    def retire(self) -> None:
        """The request is over: what it learned of acceptance is the next request's prior."""
        for name, model in self.models.items():
            self.tuning.priors[name] = model.acceptance


@dataclass
class Tuning:
    """What an engine learns across requests, deliberately (a service's prompts resemble each other): the
    step costs of this machine, the draft's confidence calibration, and per drafter the acceptance estimate
    a new request starts from as a light prior (the last finished request's). Everything else is per request."""

    steps: StepCosts | None = None  # None until the first auto-k request measures or reads the profiles
    calibration: ConfidenceCalibration = field(default_factory=ConfidenceCalibration)
    priors: dict[str, AcceptanceEstimate] = field(default_factory=dict)
    policy: Policy = Policy()
    prior_weight: float = 3.0  # observations per position the prior is worth: a new prompt outweighs it soon

    def for_request(self, drafters: list[str]) -> RequestCosts:
        models = {}
        for name in drafters:
            acceptance = copy.deepcopy(self.priors.get(name)) or AcceptanceEstimate()
            acceptance.rebase(self.prior_weight)
            calibration = self.calibration if name == MODEL else None
            models[name] = CostModel(self.steps, name, acceptance, calibration, self.policy)
        return RequestCosts(self, models)
