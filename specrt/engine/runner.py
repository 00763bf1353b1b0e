"""The runner: turns the scheduler's decisions into graph runs over the rows of the batch.

- `prefill`: a chunk of one request's prompt into its target slot (alone: a long chunk would pad every
  other row of a batched run to its width).
- `propose`: the rows that draft this round, one batched draft-model step per draft position for the rows
  still drafting (a row leaves when it has its k tokens, or earlier when its confidence says the rest would
  likely be rejected). A row whose draft slot fell behind by more than a step (rounds it sat out) first
  catches up alone, in chunks, for the same reason as prefill.
- `target_pass`: ONE batched target pass over every running row's [last token, drafts...], then the
  verification of every row in one decider call.
Each model keeps one KV slot per request (the same index in both); rows are ragged and padded by the
session. Logits stay where the model wrote them: the decider (decide.py) says what each run should compute
beside them (`top`: the greedy pick, when every row is greedy) and turns them into ids, on the device (the
model runs' own picks, or the sampler graphs) or on the host (numpy). The runner times its runs and knows nothing about
stopping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..runtime.session import ModelSession
from .request import Request

CATCH_UP_CHUNK = 64  # draft catch-up tokens per run


@dataclass
class Proposal:
    """What the draft model proposed for one row this round."""

    tokens: list[int] = field(default_factory=list)
    lookup: bool = False  # prompt lookup's proposal (one-hot q), not the draft model's
    confidences: list[float] = field(default_factory=list)  # the draft's probability of each token
    step_ms: float | None = None  # mean time of the batched 1-2 token steps this row took part in
    first_ms: float | None = None  # the first of them (it feeds 1-2 tokens into caches the target just used)


class Runner:
    def __init__(self, target: ModelSession, draft: ModelSession | None, decider):
        self.target, self.draft, self.decider = target, draft, decider
        # Milliseconds the last `propose` spent catching draft slots up: a cost of switching drafting back
        # on after rounds without it, not of the round's k (the batch's cost model must not learn it as such),
        # and the tokens it fed (a round alone teaches the step costs what a catch-up really costs).
        self.catch_up_ms, self.catch_up_tokens = 0.0, 0
        # Milliseconds the last `target_pass`'s verification spent inside ONNX Runtime (the sampler graph:
        # not the model's pass, which is what profiles time, but runtime all the same in a request's stats).
        self.decide_ms = 0.0

    def prefill(self, request: Request, chunk: int) -> int | None:
        """Feed the next chunk of the prompt (all but its last token stays in the cache); the first token once
        the whole of it is in (a verification of nothing drafted), else None."""
        row = self.target.kv.rows[request.slot]
        prompt = request.prompt
        end = min(len(prompt), row.length + chunk)
        last = end == len(prompt)
        top = self.decider.top([request], draft=False) if last else 0
        logits = self.target.run_logits([request.slot], [prompt[row.length : end]], [1], top)
        if not last:
            return None
        return self.decider.verify(logits, [request], [[]], [False])[0][1]

    def propose(
        self,
        rows: list[tuple[Request, int]],
        more: Callable[[Request, int, list[float]], bool],
        early: Callable[[Request], bool] = lambda r: True,
        rides: Callable[[Request], bool] = lambda r: False,
    ) -> dict[int, Proposal]:
        """Up to k tokens per (request, k); more(request, k, confidences) may end a row's drafting early where
        early(request) says it may (elsewhere a row drafts exactly k, unasked). A row that rides(request) (a
        batch raised its k towards the widest row's: BatchChoice.riders) drafts, up to its k, while a row that
        does not still drafts, whatever its own rule says: never past them, so it never widens the pass."""
        out = {r.id: Proposal() for r, _ in rows}
        self.catch_up_ms, self.catch_up_tokens = 0.0, 0
        if not rows:
            return out
        kv = self.draft.kv
        t0 = time.perf_counter()
        for r, _ in rows:  # a slot far behind catches up alone first (it would pad the batched steps)
            behind = len(r.tokens) - kv.rows[r.slot].length
            while behind > 2:
                n = min(behind - 1, CATCH_UP_CHUNK)
                start = kv.rows[r.slot].length
                self.draft.run_logits([r.slot], [r.tokens[start : start + n]], [1])  # logits unread
                behind -= n
                self.catch_up_tokens += n
        self.catch_up_ms = 1000 * (time.perf_counter() - t0)
        riding = {r.id for r, _ in rows if rides(r)}  # not on their own rule: with the rows they ride with
        active = {r.id: (r, k, early(r) and r.id not in riding) for r, k in sorted(rows, key=lambda rk: rk[0].slot)}
        feed = {r.id: r.tokens[kv.rows[r.slot].length :] for r, _ in rows}  # the last 1-2 tokens
        spent = dict.fromkeys(out, 0.0)  # per row: milliseconds of the steps it took part in, and how many
        taken = dict.fromkeys(out, 0)
        self.decider.begin_round(max(k for _, k in rows), self.draft.vocab_size)
        step, chain = 0, None
        while active:
            order = list(active.values())
            requests = [r for r, _, _ in order]
            left = [k - len(out[r.id].tokens) for r, k, _ in order]
            t0 = time.perf_counter()
            top = self.decider.top(requests, True)
            if chain is not None and (len(order) != chain.drafting or chain.room() < 1):  # a row stopped
                chain = None
            if chain is None and top in (0, 2):  # the picks feed the next steps on the device
                chain, lanes = self._chain(requests, feed, max(left), top == 0, step) or (None, None)
            if chain is not None:
                # Back to back while no row may stop early (each then drafts exactly its k), else one at a time.
                n = 1 if any(stops for _, _, stops in order) else min(min(left), chain.room())
                uniforms = self.decider.uniforms(lanes, n) if chain.picks is not None else None
                tokens, confidences = chain.run(n, uniforms)
            else:
                logits = self.draft.run_logits(
                    [r.slot for r in requests], [feed[r.id] for r in requests], [1] * len(order), top
                )
                picked = self.decider.pick(logits, requests, step)
                tokens, confidences = [picked[0]], [picked[1]]
            ms, n = 1000 * (time.perf_counter() - t0), len(tokens)
            for i, (r, k, stops) in enumerate(order):
                p = out[r.id]
                if not taken[r.id]:
                    p.first_ms = ms / n
                spent[r.id] += ms
                taken[r.id] += n
                p.tokens += [t[i] for t in tokens]
                p.confidences += [c[i] for c in confidences]
                feed[r.id] = [p.tokens[-1]]
                # Each row stops on its own rule, at batch 1 and in a batch alike. (Stopping the rows short of
                # their k together, when none would go on, was measured against this in interleaved A/B runs
                # at 4 rows, T = 0.7: this rule ran 1.019x (int4) and 1.028x (fp32) as fast, median of 16
                # paired ratios each; results/trust/joint-stop.)
                if len(p.tokens) >= k or (stops and not more(r, k, p.confidences)):
                    del active[r.id]
            if riding and riding.issuperset(active):  # the rows they rode with have stopped
                active.clear()
            step += n
        for rid, p in out.items():
            p.step_ms = spent[rid] / taken[rid] if taken[rid] else None
        return out

    def _chain(self, requests: list[Request], feed: dict[int, list[int]], steps: int, sampled: bool, step: int):
        """A chain of draft steps over the slot range the rows (in slot order) span, its first step feeding each
        row feed[id] (slots in the range that do not draft run idle); each step's picks the model's own (all
        greedy) or the sampler graph's. None when the bundle's graph or the decider cannot chain, or the slots
        are full. A sampled chain starts with the round (its picks store q at draft positions 0, 1, ..., where
        the verification reads them). Returns the chain and the range's rows (a request, or None: idle)."""
        if sampled and step > 0:
            return None
        lo, hi = requests[0].slot, requests[-1].slot + 1
        chain = self.draft.chain(lo, hi)
        if chain is None:
            return None
        lanes: list[Request | None] = [None] * (hi - lo)  # the range's rows: a request, or None (idle)
        for r in requests:
            lanes[r.slot - lo] = r
        picks = None
        if sampled:
            picks = self.decider.chain_picks(lanes, lo, hi)
            if picks is None:
                return None
        chain.start([None if r is None else feed[r.id] for r in lanes], steps, picks)
        return (chain, lanes) if chain.room() >= 1 else None

    def target_pass(self, rows: list[tuple[Request, Proposal]]) -> tuple[list[tuple[int, int]], float]:
        """One target pass over every row's [last token, drafts] and their verification: per row (accepted
        drafts, next token), and the milliseconds of the pass (the model's run alone, as profiles time it:
        the cost model compares the two, and a verification counted in one but not the other would make a
        small model's profile look wrong)."""
        t0 = time.perf_counter()
        drafted = [p.tokens for _, p in rows]
        requests = [r for r, _ in rows]
        logits = self.target.run_logits(
            [r.slot for r in requests],
            [[r.tokens[-1], *p.tokens] for r, p in rows],
            [len(d) + 1 for d in drafted],
            self.decider.top(requests, draft=False),
        )
        ms = 1000 * (time.perf_counter() - t0)
        before = self.decider.seconds
        decided = self.decider.verify(logits, requests, drafted, [p.lookup for _, p in rows])
        self.decide_ms = 1000 * (self.decider.seconds - before)
        return decided, ms
