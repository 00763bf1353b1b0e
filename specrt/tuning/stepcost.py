"""What the target's and the draft's forwards cost now: a measured profile, times the machine's live speed,
times a learned ratio per kind of forward.

One `StepCosts` per engine, shared by every request (it describes the machine, not the text). Four things
are learned from live timings, each for a reason:
- **The machine's speed** (live / profiled time of the target's plain 1-token steps): a machine that got
  faster or slower (clock, a neighbour's load) changes every forward, not only the kind last observed.
  (When it was learned per kind, verify and draft estimates went stale while plain decoding ran 30% faster
  than profiled, and drafting, which would have paid, never looked worth trying.) Until a plain step has
  been seen, the target's wide passes stand in for it; the first plain step is taken as measured, and the
  wide passes' estimate, which was measured too, is kept as their ratio.
- **A ratio per kind** of forward against that speed: the target's wide (verify) passes, the draft's steps.
  Drafting and verifying alternate two models on the same cores, so a verify pass runs with caches the draft
  has just evicted; learning one scale from both would make plain decoding look as slow as that and
  speculation win on paper. A kind not yet seen borrows its model's other kind's ratio. Two kinds are finer:
  the target's wide passes also get a ratio per width, and the draft's first step of a round one apart from
  its later steps. From k = 1 rounds alone one wide ratio and one draft step priced k = 3 11% above what it
  ran (int4 pair, Zen 3 CPU: a width-2 pass at 1.14x its profile, width 4 at 1.05x; the first draft step,
  which feeds 1-2 tokens into caches the target pass has just used, 19.2 ms, the later ones 14.4), so auto
  stayed at k = 1 where k = 3 ran 1.07-1.25x faster (results/trust/batch-s26-avx2). A width's first run in
  the engine is cold (ONNX Runtime's first run of a shape) and only marks it warm; a width's ratio starts
  from the wide passes' and moves by the bounded smoothing (taken as measured, one noisy width-3 timing
  priced k = 2 1.2x dear: results/trust/widen), later draft steps borrow the first step's. What is never run is never
  timed: the cost model widens a round now and then to time what it would otherwise only extrapolate
  (costmodel.py: `Policy.widen_every`, `since_timed`).
- **Live timings over stored ones**: the first live timing of each kind replaces the profile's estimate
  outright (a profile measured while another job took the cores can be 5-10x off: with one stored 5x too
  slow for the draft, bounded smoothing needed ~15 probes to correct it, and auto k ran at 0.75x of its
  speed with a right profile). After that each estimate moves by at most a factor of 2 of itself per
  observation, smoothed (`decay`): one odd timing (a page fault, a neighbour's burst) moves it by at most
  20%, a lasting change wins within rounds.
- **What a catch-up costs**, a ratio of its own: the draft's forward over the tokens it missed (rounds it sat
  out) is priced from the profile per `CATCH_UP_WIDTH`-token chunk, while the runner feeds up to 64 tokens a
  run, so the price ran 1.5-2x the measured time (int4 0.5B draft on a Zen 3 CPU: 8 tokens 49-60 ms against
  88 priced, 16 tokens 87-93 against 144). A dear price keeps a request that went plain from ever probing
  again, since each plain round adds a token to the catch-up (costmodel.py: `probe_budget`); so the learned
  price may lower the old one, never raise it (`catch_up_ms`).
Observations come only from rounds that ran alone (a batched pass prices the batch, not a row).

Learning corrects the estimates but not the file: the next engine would start from the same wrong profile.
So once a model's live step time has settled more than `WRONG`-fold away from its profile (`wrong()`; the
machine's drift here is up to 2x, so less proves nothing), the engine measures that model again in its
next idle moment and keeps the new profile (engine/api.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

Profile = Callable[[int, int], float]  # (S new tokens, context) -> ms, measured offline on this machine
TARGET, DRAFT = "target", "draft"
CATCH_UP_WIDTH = 16  # the widest forward profiles price (measure.WIDTHS reaches it)
WRONG = 2.5  # live / profiled time of a model's steps beyond this factor (either way): the profile is wrong
SETTLED = 4  # observations of a model's steps before its profile is judged


def _kind(width: int) -> str:
    return "plain" if width == 1 else "wide"


class StepCosts:
    def __init__(self, target: Profile, draft: Profile | None = None, *, learn: bool = True, decay: float = 0.8):
        self.profiles = {TARGET: target, DRAFT: draft}
        self.learn = learn  # False: the estimates stay the profiles' (a fixed cost landscape, for tests)
        self.decay = decay
        self.speed = 1.0  # live / profiled time of the target's plain steps
        self.speed_from: str | None = None  # the kind that set the speed: None (the profile), "wide", "plain"
        self.ratios: dict[tuple[str, str], float] = {}  # (model, kind) -> live / (profile * speed)
        self.seen: Counter[str] = Counter()  # observations per model
        self.passes = 0  # target passes observed
        self.timed: dict[int, int] = {}  # target width -> `passes` when it was last timed
        self.warm: set[int] = set()  # target widths timed once (a width's first run is cold, not its price)

    def live_factor(self, model: str) -> float:
        """Live / profiled time of this model's steps as learned so far (1.0: as profiled)."""
        return self.speed * (self.ratio(model, "plain") if model == DRAFT else 1.0)

    def wrong(self) -> list[str]:
        """The models whose profile the live timings have proven wrong (more than WRONG-fold off, after
        SETTLED observations): to be measured again."""
        return [m for m in (TARGET, DRAFT) if self.seen[m] >= SETTLED and not 1 / WRONG <= self.live_factor(m) <= WRONG]

    def ratio(self, model: str, kind: str) -> float:
        """Live / (profile x speed) of a kind of forward: the target's "plain", "wide" or "wide:W" (width W),
        the draft's "first" (a round's first step), "plain" (its later steps), "wide" or "catch-up". A kind
        not learned yet borrows: a target width the wide passes' ratio, a draft kind the later steps', then the
        first step's."""
        if (model, kind) == (TARGET, "plain"):
            return 1.0
        fallbacks = (kind, "wide") if model == TARGET else (kind, "plain", "first", "wide")
        return next((self.ratios[model, k] for k in fallbacks if (model, k) in self.ratios), 1.0)

    def ms(self, model: str, width: int, context: int) -> float:
        kind = f"wide:{width}" if model == TARGET and width > 1 else _kind(width)
        return self.profiles[model](width, context) * self.speed * self.ratio(model, kind)

    def draft_round_ms(self, k: int, context: int) -> float:
        """The draft's k steps of a round: the first (dearer: it feeds 1-2 tokens into caches the target pass
        has just used) and k - 1 later ones."""
        if k <= 0 or self.profiles[DRAFT] is None:
            return 0.0
        step = self.profiles[DRAFT](1, context) * self.speed
        return step * (self.ratio(DRAFT, "first") + (k - 1) * self.ratio(DRAFT, "plain"))

    def since_timed(self, width: int) -> int:
        """Target passes observed since one of `width` was timed (never: "forever")."""
        return self.passes - self.timed[width] if width in self.timed else 1 << 30

    def catch_up_ms(self, tokens: int, context: int) -> float:
        """The draft's forward over `tokens` it missed: the profile's price (`_catch_up_profiled`) times the
        machine's speed and the catch-ups' learned ratio, never above the draft steps' (the price before any
        catch-up was timed). A dearer price is never believed: at one stream it makes every probe wait for a
        catch-up it cannot afford, and only a drafting round times a catch-up again, so one slow timing (a
        cold first run of a new shape, a neighbour's burst) would keep a request plain for good; suspected in
        results/trust/batch-s25-avx2-c1, where auto ran 508 of 508 rounds plain."""
        ratio = min(self.ratio(DRAFT, "catch-up"), self.ratio(DRAFT, "plain"))
        return self._catch_up_profiled(tokens, context) * self.speed * ratio

    def _catch_up_profiled(self, tokens: int, context: int) -> float:
        """Per chunk at the widest profiled width (the cheapest per token the profiles know; the runner's
        chunks are wider still, so this errs high until a catch-up is timed)."""
        if tokens <= 0 or self.profiles[DRAFT] is None:
            return 0.0
        chunk = min(tokens, CATCH_UP_WIDTH)
        return self.profiles[DRAFT](chunk, context) * tokens / chunk

    def observe_catch_up(self, tokens: int, context: int, ms: float) -> None:
        """The draft was fed `tokens` it had missed in `ms` (in a round that ran alone), at `context`."""
        profiled = self._catch_up_profiled(tokens, context) * self.speed
        if not (self.learn and profiled > 0 and ms > 0):
            return
        self._learn((DRAFT, "catch-up"), ms / profiled)

    def observe(self, model: str, width: int, context: int, ms: float, first: bool = False) -> None:
        """A forward of `width` new tokens after `context` took `ms` (in a round that ran alone); first: the
        draft's first step of its round."""
        profiled = self.profiles[model](width, context) if self.profiles[model] is not None else 0.0
        if not (self.learn and profiled > 0 and ms > 0):
            return
        live, kind = ms / profiled, "first" if first else _kind(width)
        self.seen[model] += 1
        if model == TARGET:
            self.passes += 1
            self.timed[width] = self.passes
            if width > 1 and width not in self.warm:  # a cold first run: it prices nothing
                self.warm.add(width)
                return
            if kind == "plain" and self.speed_from != "plain":
                if self.speed_from == "wide":  # keep the wide passes' measured estimate
                    self.ratios[TARGET, "wide"] = self.speed / live
                self.speed, self.speed_from = live, "plain"
                return
            if kind == "plain" or self.speed_from != "plain":
                initial = self.speed_from is None  # the first live timing: as measured
                self.speed, self.speed_from = live if initial else self._smooth(self.speed, live), kind
                return
        self._learn((model, kind), live / self.speed)
        if model == TARGET:  # and the width's own, from the wide passes' (one noisy timing moves it 20% at most)
            self.ratios.setdefault((TARGET, f"wide:{width}"), self.ratio(TARGET, "wide"))
            self._learn((TARGET, f"wide:{width}"), live / self.speed)

    def _learn(self, key: tuple[str, str], ratio: float) -> None:
        """A kind's first live timing as measured, not smoothed; later ones smoothed."""
        self.ratios[key] = ratio if key not in self.ratios else self._smooth(self.ratios[key], ratio)

    def _smooth(self, current: float, observed: float) -> float:
        bounded = min(max(observed, 0.5 * current), 2.0 * current)
        return self.decay * current + (1 - self.decay) * bounded
