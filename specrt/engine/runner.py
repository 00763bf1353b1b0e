"""The runner: turns the scheduler's decisions into graph runs over the rows of the batch.

- `prefill`: a chunk of one request's prompt into its target slot (alone: a long chunk would pad every
  other row of a batched run to its width).
- `propose`: the rows that draft this round, one batched draft-model step per draft position for the rows
  still drafting (a row leaves when it has its k tokens, or earlier when its confidence says the rest would
  likely be rejected). A row whose draft slot fell behind by more than a step (rounds it sat out) first
  catches up alone, in chunks, for the same reason as prefill.
- `target_pass`: ONE batched target pass over every running row's [last token, drafts...].
Each model keeps one KV slot per request (the same index in both); rows are ragged and padded by the
session. The runner times its runs and knows nothing about acceptance or stopping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..decoding.speculative import pick, top_probability
from ..runtime.session import ModelSession
from .request import Request

CATCH_UP_CHUNK = 64  # draft catch-up tokens per run


@dataclass
class Proposal:
    """What the draft model proposed for one row this round."""

    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray | None] = field(default_factory=list)  # the distribution each token was drawn from
    confidences: list[float] = field(default_factory=list)  # the draft's probability of each token
    step_ms: float | None = None  # mean time of the batched 1-2 token steps this row took part in


class Runner:
    def __init__(self, target: ModelSession, draft: ModelSession | None):
        self.target, self.draft = target, draft

    def prefill(self, request: Request, chunk: int) -> np.ndarray | None:
        """Feed the next chunk of the prompt (all but its last token stays in the cache); the logits after the
        prompt once the whole of it is in, else None."""
        row = self.target.kv.rows[request.slot]
        prompt = request.prompt
        end = min(len(prompt), row.length + chunk)
        logits = self.target.run([request.slot], [prompt[row.length : end]], [1])[0]
        return logits[-1] if end == len(prompt) else None

    def propose(
        self,
        rows: list[tuple[Request, int]],
        more: Callable[[Request, int, list[float]], bool],
    ) -> dict[int, Proposal]:
        """Up to k tokens per (request, k); more(request, k, confidences) may end a row's drafting early."""
        out = {r.id: Proposal() for r, _ in rows}
        if not rows:
            return out
        kv = self.draft.kv
        for r, _ in rows:  # a slot far behind catches up alone first (it would pad the batched steps)
            behind = len(r.tokens) - kv.rows[r.slot].length
            while behind > 2:
                n = min(behind - 1, CATCH_UP_CHUNK)
                start = kv.rows[r.slot].length
                self.draft.run([r.slot], [r.tokens[start : start + n]], [1])
                behind -= n
        active = {r.id: (r, k) for r, k in rows}
        feed = {r.id: r.tokens[kv.rows[r.slot].length :] for r, _ in rows}  # the last 1-2 tokens
        steps: dict[int, list[float]] = {r.id: [] for r, _ in rows}
        while active:
            order = list(active.values())
            t0 = time.perf_counter()
            logits = self.draft.run([r.slot for r, _ in order], [feed[r.id] for r, _ in order], [1] * len(order))
            ms = 1000 * (time.perf_counter() - t0)
            for (r, k), row_logits in zip(order, logits, strict=True):
                p = out[r.id]
                steps[r.id].append(ms)
                token, q = pick(row_logits[-1], r.options, r.rng)
                p.tokens.append(token)
                p.q.append(q)
                p.confidences.append(float(q[token]) if q is not None else top_probability(row_logits[-1]))
                feed[r.id] = [token]
                if len(p.tokens) >= k or not more(r, k, p.confidences):
                    del active[r.id]
        for rid, p in out.items():
            p.step_ms = float(np.mean(steps[rid])) if steps[rid] else None
        return out

    def target_pass(self, rows: list[tuple[Request, list[int]]]) -> tuple[list[np.ndarray], float]:
        """One target pass over every row's [last token, drafts]: per row its k + 1 rows of logits (the
        arrays live until the next run), and the pass's milliseconds."""
        t0 = time.perf_counter()
        logits = self.target.run(
            [r.slot for r, _ in rows], [[r.tokens[-1], *d] for r, d in rows], [len(d) + 1 for _, d in rows]
        )
        return logits, 1000 * (time.perf_counter() - t0)
