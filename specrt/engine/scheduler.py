"""The scheduler: decides each round which requests run, which prompt chunk is prefilled and how many tokens
every row drafts, then settles each row's round.

Requests wait in arrival order until a slot (a KV row in each model) is free; a finished or cancelled
request frees its slot at once. A round is: at most one prefill chunk (of the oldest request still
prefilling: `chunk` tokens when others are decoding, so they stall for one chunk at most, the whole prompt
when nobody else is waiting on the cores), then one speculative round over every running row:
1. plan: each row's drafter and k (its own cost models as if alone, then the batch's ceiling);
2. run: the batched draft steps and the ONE batched target pass (runner.py);
3. settle, per row: the decider's verdict (accepted drafts, next token), roll the caches back by counters, count, learn
   (one `observe` of the row's cost models and one of the batch's), commit (request.py).
Batch 1 is this same path with one row; target-only decoding is k = 0 in it.
"""

from __future__ import annotations

import time
from collections import deque

from ..decoding.drafters import NgramDrafter
from ..tuning.batchcost import BatchChoice, BatchCost
from ..tuning.costmodel import MODEL, NGRAM, Choice, Outcome
from .plan import Plan, Times
from .request import Request
from .runner import Proposal, Runner
from .stats import EngineStats


class Scheduler:
    def __init__(self, runner: Runner, slots: int, chunk: int = 128, prepare=None):
        self.runner = runner
        self.prepare = prepare  # called with each request once it has a slot, before its prefill
        self.slots: list[Request | None] = [None] * slots
        self.freed: list[int] = [-1] * slots  # when each slot was last freed (admissions so far; -1: never used)
        self._admitted = 0
        self.waiting: deque[Request] = deque()
        self.chunk = chunk
        self.batch_cost: BatchCost | None = None  # set by the engine when it runs auto k at batch > 1
        self.stats = EngineStats()

    # ------------------------------------------------------------------ admission and retirement

    def submit(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def running(self) -> list[Request]:
        return [r for r in self.slots if r is not None]

    def has_work(self) -> bool:
        return bool(self.waiting) or any(r is not None for r in self.slots)

    def _retire(self) -> None:
        for i, r in enumerate(self.slots):
            if r is not None and (r.state == "finished" or r.cancel.is_set()):
                self._release(i, "cancelled")
        while self.waiting and self.waiting[0].cancel.is_set():
            self.waiting.popleft().finish("cancelled")

    def _release(self, slot: int, reason: str) -> None:
        r = self.slots[slot]
        r.finish(reason)  # no-op when it already finished
        if r.costs is not None:
            r.costs.retire()
        self.stats.requests[r.stats.finish_reason] += 1
        self.stats.generated_tokens += r.generated
        # The target's slot keeps what it holds (a later prompt with the same prefix reuses it), cut to the
        # committed tokens: positions past them may hold a round's rejected drafts.
        target, draft = self.runner.target.kv.rows[slot], self.runner.draft
        target.truncate(len(r.tokens) - 1)
        if draft is not None:
            draft.kv.rows[slot].truncate(len(r.tokens))
        self.slots[slot] = None
        self.freed[slot] = self._admitted

    def _admit(self) -> None:
        while self.waiting and None in self.slots:
            r = self.waiting.popleft()
            if r.cancel.is_set():
                r.finish("cancelled")
                continue
            free = [i for i, s in enumerate(self.slots) if s is None]
            taken = [i for i, s in enumerate(self.slots) if s is not None]
            # The free slot whose cache serves this prompt best (a follow-up turn, a repeated system prompt):
            # the prefix it holds, less half of what reusing it throws away (the rest of its context, which
            # a follow-up of its own might have wanted), less what the slot's place costs the batch. A batched
            # run covers the slot range its rows span and computes an idle slot inside it as a row: each idle
            # slot the choice leaves inside the span costs a row's step, about a prompt token's prefill in
            # work, in every round the request may run (4 rows spread over 16 slots: passes of 130 ms against
            # 57). Where no slot gains, the one freed longest ago (never used first): the contexts finished
            # most recently stay for the follow-ups most likely to come. At least one prompt token is always
            # fed, to get the first logits.
            # Requests still waiting fill holes at once: only the rest stay idle.
            rows, rounds, filled = self.runner.target.kv.rows, r.options.max_new_tokens, len(self.waiting)
            idle = {i: max(_holes(taken, i) - filled, 0) for i in free}
            slot = max(free, key=lambda i: (_reuse(rows[i], r.prompt) - idle[i] * rounds, -self.freed[i], -i))
            self._admitted += 1
            rows[slot].truncate(min(rows[slot].common_prefix(r.prompt), len(r.prompt) - 1))
            if self.runner.draft is not None:
                draft = self.runner.draft.kv.rows[slot]
                draft.truncate(draft.common_prefix(r.prompt))
            r.slot, r.state = slot, "prefilling"
            r.started = time.perf_counter()
            self.slots[slot] = r
            if self.prepare is not None:  # may measure cost profiles: not decode time (Stats.setup_s)
                t0 = time.perf_counter()
                self._guarded([r], lambda r=r: self.prepare(r))
                r.stats.setup_s = time.perf_counter() - t0
            if self.batch_cost is not None:
                self.batch_cost.joined()
            self.stats.queue_wait_s.append(r.started - r.submitted)
            del self.stats.queue_wait_s[:-1000]
            self.stats.prompt_tokens += len(r.prompt)
            r.stats.cached_tokens = rows[slot].length
            self.stats.cached_prompt_tokens += rows[slot].length

    # ------------------------------------------------------------------ one round

    def step(self) -> None:
        """One round: retire, admit, one prefill chunk, one speculative round over the running rows."""
        self._retire()
        self._admit()
        prefilling = [r for r in self.running if r.state == "prefilling"]
        decoding = [r for r in self.running if r.state == "running"]
        if prefilling:
            self._guarded([prefilling[0]], lambda: self._prefill(prefilling[0], alone=not decoding))
        if decoding:
            self._guarded(decoding, lambda: self._round(decoding, joining=bool(prefilling)))
        for i, r in enumerate(self.slots):
            if r is not None and r.state == "finished":
                self._release(i, r.stats.finish_reason or "cancelled")

    def _guarded(self, rows: list[Request], work) -> None:
        """A failure (a graph run that raised) fails the requests it touched, not the engine."""
        try:
            work()
        except Exception as e:  # noqa: BLE001 - handed to the requests' readers
            for r in rows:
                r.fail(e)
                self._release(r.slot, "error")

    def _prefill(self, r: Request, alone: bool) -> None:
        t0 = time.perf_counter()
        first = self.runner.prefill(r, len(r.prompt) if alone else self.chunk)
        r.stats.prefill_s += time.perf_counter() - t0
        r.stats.runtime_s += time.perf_counter() - t0
        if first is not None:  # the first token: a round with nothing drafted
            r.state = "running"
            r.commit([first])

    def _round(self, rows: list[Request], joining: bool = False) -> None:
        """One round over the decoding rows; joining: requests are still prefilling (they join next rounds)."""
        plans = [self._plan(r, alone=len(rows) == 1) for r in rows]
        if joining:
            plans = [p.capped(0) if self._entry_fee(r, p) else p for r, p in zip(rows, plans, strict=True)]
        context = max(len(r.tokens) for r in rows)  # the batched passes attend every row over the longest
        span = _span([r.slot for r in rows])  # ... and compute every slot of the rows' range
        batch = self._batch_choice(rows, plans, context, span)
        if batch is not None:
            plans = [p.capped(k) for p, k in zip(plans, batch.ks, strict=True)]
        t0 = time.perf_counter()
        drafting = [(r, p.k) for r, p in zip(rows, plans, strict=True) if p.drafter == MODEL and p.k]
        widening = {r.id for r, p in zip(rows, plans, strict=True) if p.widens}  # the whole ceiling, unasked
        riding = {rows[i].id for i in batch.riders} if batch is not None else set()  # raised towards the widest k
        proposals = self.runner.propose(
            drafting,
            self._keep_drafting,
            lambda r: r.id not in widening and self._stops_early(r),
            lambda r: r.id in riding,
        )
        draft_ms = 1000 * (time.perf_counter() - t0)
        for r, p in zip(rows, plans, strict=True):
            if p.drafter == MODEL and p.k:
                p.proposal = proposals[r.id]
            elif p.drafter == NGRAM and p.k:
                p.proposal = Proposal(p.lookup, lookup=True)
        decided, target_ms = self.runner.target_pass([(r, p.proposal) for r, p in zip(rows, plans, strict=True)])
        if batch is not None:  # the round's own steps: a draft slot's catch-up after plain rounds is not k's cost
            drafted, model = [len(p.proposal.tokens) for p in plans], [p.drafter == MODEL for p in plans]
            round_ms = draft_ms - self.runner.catch_up_ms + target_ms
            accepted = [n for n, _ in decided]
            self.batch_cost.observe(batch, drafted, model, context, round_ms, accepted, span)
        self.stats.rounds += 1
        self.stats.batch_sizes[len(rows)] += 1
        for r, p, (n, nxt) in zip(rows, plans, decided, strict=True):
            row_draft_ms = draft_ms if p.drafter == MODEL and p.k else 0.0
            caught_up = (self.runner.catch_up_tokens, self.runner.catch_up_ms)  # learned from rounds alone only
            times = Times(row_draft_ms, target_ms, len(rows) == 1, self.runner.decide_ms, caught_up)
            self._settle(r, p, n, nxt, times)

    def _batch_choice(self, rows: list[Request], plans: list[Plan], context: int, span: int) -> BatchChoice | None:
        """The batch's ceiling on the rows' own choices (batches of two rows or more, with a batch cost)."""
        if len(rows) == 1 or self.batch_cost is None:
            return None
        return self.batch_cost.choose(
            [p.k for p in plans],
            [self._expected(r, p.drafts_with) for r, p in zip(rows, plans, strict=True)],
            [r.options.num_draft_tokens is not None for r in rows],
            [p.drafts_with == MODEL for p in plans],
            context,
            [_catch_up_ms(r, p) for r, p in zip(rows, plans, strict=True)],
            max(r.remaining for r in rows),
            [p.room for p in plans],
            span,
        )

    # ------------------------------------------------------------------ settling one row's round

    def _settle(self, r: Request, plan: Plan, n: int, nxt: int, times: Times) -> None:
        proposal = plan.proposal
        drafted, k = proposal.tokens, len(proposal.tokens)
        before = len(r.tokens)
        self._roll_back(r, k, n)
        self._count(r, plan, k, n, times)
        if r.costs is not None:
            outcome = Outcome(
                plan.drafter if k else None,
                k,
                n,
                before,
                times.alone,
                times.target_ms,
                proposal.step_ms,
                tuple(proposal.confidences),
                times.catch_up,
                proposal.first_ms,
            )
            r.costs.observe(plan.choices, outcome)
        if times.alone and self.runner.draft is not None and not self._drafted(r):
            r.entry_output += n + 1  # decoded alone, its draft never fed: entry fee (`_missed`)
        r.commit([*drafted[:n], nxt])

    def _roll_back(self, r: Request, k: int, n: int) -> None:
        """Rejected drafts leave the caches by moving their length counters; no buffer is touched. The target
        holds [.., last, d_1..d_k]: k - n positions go. The draft holds at most the accepted ones."""
        before = len(r.tokens)
        self.runner.target.kv.rows[r.slot].rollback(k - n)
        if self.runner.draft is not None:
            self.runner.draft.kv.rows[r.slot].truncate(before + n)

    def _count(self, r: Request, plan: Plan, k: int, n: int, times: Times) -> None:
        """The request's statistics and the engine's counters for one round."""
        s, e = r.stats, self.stats
        s.rounds += 1
        s.drafted += k
        s.accepted += n
        s.k_histogram[k] += 1
        s.rounds_by_drafter[f"{plan.drafter if k else 'none'}/{k}"] += 1
        s.draft_s += times.draft_ms / 1000
        s.target_s += times.target_ms / 1000
        s.runtime_s += (times.target_ms + times.draft_ms + times.decide_ms) / 1000
        e.k_chosen[k] += 1
        if k:
            e.drafts += 1
            e.draft_tokens += k
            e.accepted_tokens += n
            for i in range(1, n + 1):
                e.accepted_per_position[i] += 1

    # ------------------------------------------------------------------ per-row choices

    def _plan(self, r: Request, alone: bool = True) -> Plan:
        """The row's drafter and k as if it ran alone (the request's options, its cost models); prompt
        lookup's proposal when n-gram drafts. With a fixed k the cheapest drafter with something to offer
        drafts (n-gram first); with auto k each drafter's cost model picks its k and the one promising the
        most tokens per millisecond drafts."""
        fixed, options = r.options.num_draft_tokens, r.options
        length = len(r.tokens)
        # The round yields at most k + 1 tokens, and the k + 1 positions fed must fit the target's slot.
        k_cap = min(r.remaining - 1, fixed if fixed is not None else options.max_draft_tokens)
        k_cap = min(k_cap, self.runner.target.max_len - length - 1)
        choices: dict[str, Choice] = {}
        best = None  # (tokens/ms, drafter name, k, lookup proposal, cap)
        spare = None  # (drafter name, cap, lookup proposal): what a batch's probe would draft with
        missed = self._missed(r) if self.runner.draft is not None else 0
        for drafter in r.drafters:
            found = None
            if isinstance(drafter, NgramDrafter):  # free to look up first: its length caps k
                found = drafter.lookup(r.tokens, k_cap)
                cap, name = len(found), NGRAM
            else:
                # The draft holds everything but its last proposal: length + k - 1 <= its max_len.
                cap, name = min(k_cap, self.runner.draft.max_len - length + 1), MODEL
            if cap <= 0:
                continue
            cost = _cost(r, name)
            if fixed is not None or cost is None:
                best = (0.0, name, cap, found, cap)
                break
            choice = choices[name] = cost.choose(cap, length, alone, missed if name == MODEL else 0, r.remaining)
            spare = spare or (name, cap, found)
            if choice.k and (best is None or choice.rate > best[0]):
                best = (choice.rate, name, choice.ceiling, found, cap)
        if best is None:
            if spare is None:
                return Plan(None, 0, choices=choices, missed=missed)
            name, cap, found = spare
            return Plan(None, 0, found or [], choices, missed=missed, spare=name, room=cap)
        _, name, k, found, cap = best
        return Plan(name, k, found[:k] if found is not None else [], choices, missed=missed, room=cap)

    def _entry_fee(self, r: Request, plan: Plan) -> bool:
        """Whether the round would make row r's draft catch up on its context before drafting (an auto-k row
        whose draft is behind by more than a step). The scheduler does not start that while other requests
        are still prefilling: a burst joins one prefill a round, so the batch grows every round, and a
        drafting round there is priced at the batch of now, not at the one it is about to be. The native pair's
        waves of 8 drafted at 2-7 rows, each row first feeding its draft the prompt, then went plain at 8
        rows: the waves' target passes took as long as plain batching's, auto added 0.3-0.5 s of draft
        work a wave, and every slower round delayed the prompts still waiting (served, 8 streams: TTFT p50
        0.59 s against 0.43 with k = 0; auto at 0.92 of plain batching). Once the batch has formed, its
        choice prices the catch-up (`_catch_up_ms`) at the batch's real size."""
        if plan.drafter != MODEL or not plan.k or r.options.num_draft_tokens is not None:
            return False
        return self._behind(r) > 2

    def _behind(self, r: Request) -> int:
        """Tokens of row r's context its draft has not been fed (1-2 after a round it drafted in)."""
        return len(r.tokens) - self.runner.draft.kv.rows[r.slot].length

    def _missed(self, r: Request) -> int:
        """Output tokens row r's draft sat out (plain rounds it did not draft in) and the runner will feed it
        before its first draft step, which drafting must pay for: all it lacks but the last one or two, less
        the entry fee. The entry fee is what any first drafting round of a request feeds: its prompt, and the
        output it decoded alone before then (its own dry spell under the prior, which its first probe ends).
        Weighing those against one generation's savings keeps a request from ever drafting, so from ever
        learning: 64-token requests alone reached their first due probe with 7 tokens missed, priced 48-59
        ms against a stake of 45-60, were refused for good and handed their prior on unchanged, so the next
        request the same (results/trust/probe-stake; leaving them out: results/trust/entry-fee). Output decoded
        while batched (a row that finishes its batch alone) or since the row last drafted is weighed."""
        if self._behind(r) <= 2:  # it kept up: fed with the round's first step
            return 0
        fed = self.runner.draft.kv.rows[r.slot].length
        unweighed = fed if self._drafted(r) else len(r.prompt) + r.entry_output
        return max(0, len(r.tokens) - 1 - unweighed)

    def _drafted(self, r: Request) -> bool:
        """Whether row r's draft has been fed any of its output (it drafted in this request): before that its
        slot holds at most a prefix of the prompt (a cache kept from an earlier request, `_admit`), after it
        at least the prompt and a token."""
        return self.runner.draft.kv.rows[r.slot].length > len(r.prompt)

    @staticmethod
    def _stops_early(r: Request) -> bool:
        """Whether `_keep_drafting` may end the row's drafting before its k (auto k, with the early stop)."""
        cost = _cost(r, MODEL)
        return cost is not None and r.options.num_draft_tokens is None and cost.policy.early_stop

    @staticmethod
    def _keep_drafting(r: Request, k: int, confidences: list[float]) -> bool:
        """Under auto k the chosen k is a ceiling: the draft stops early where its own confidence says the
        rest of the round would likely be rejected (a fixed k drafts exactly k). It depends on the draft
        alone, so verification stays exact."""
        cost = _cost(r, MODEL)
        if cost is None or r.options.num_draft_tokens is not None:
            return True
        return cost.keep_drafting(confidences, k, len(r.tokens))

    @staticmethod
    def _expected(r: Request, drafter: str | None):
        cost = _cost(r, drafter)
        if cost is None:  # fixed k or no cost model: a neutral estimate
            return lambda k: 1.0 + 0.7 * k
        return cost.acceptance.expected_tokens


def _catch_up_ms(r: Request, plan: Plan) -> float:
    """What row r's draft must spend on the output tokens it sat out before it can draft (0: fixed k)."""
    cost = _cost(r, plan.drafts_with)
    return cost.catch_up_ms(plan.missed, len(r.tokens)) if cost is not None and plan.drafts_with == MODEL else 0.0


def _cost(r: Request, drafter: str | None):
    """The request's cost model for `drafter` (None: fixed k, or nothing that drafts)."""
    return r.costs.get(drafter) if r.costs is not None else None


def _span(slots: list[int]) -> int:
    """The slots a batched run over rows in `slots` covers: their range, idle slots inside it computed as rows
    (a batch ending leaves holes: 2 rows left in slots 0 and 7 ran passes as dear as 8 rows, and priced as 2
    rows they taught the batch cost that plain rounds cost twice their profile)."""
    return max(slots) - min(slots) + 1


def _holes(taken: list[int], slot: int) -> int:
    """Idle slots inside the range a batched run covers once `slot` joins the rows in slots `taken`."""
    return _span([*taken, slot]) - len(taken) - 1


def _reuse(row, prompt) -> float:
    """What a slot's cache is worth to a prompt: the prefix it holds less half of the context it would lose."""
    common = row.common_prefix(prompt)
    return max(common - 0.5 * (row.length - common), 0.0)
