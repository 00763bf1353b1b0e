"""Deciders: the two decisions of a round, picking a draft token and verifying drafts, behind one interface.

- `GraphDecider` decides on the device the logits are on: a round whose rows are all greedy reads the ids
  (and the draft's confidences) its model runs computed beside their logits (`top`: no run after the
  model's, the acceptance a prefix comparison of a few ids); any other round runs the bundle's sampler graphs
  (specrt.runtime.sampler): the host sends settings, drafted ids and uniforms, and reads back ids, accepted
  counts and confidences. A draft on a device of its own picks with a sampler there; a sampled
  verification on the target's device then reads the verified slots' q from it.
- `HostDecider` reads the logits back into numpy and runs the reference maths (specrt.decoding.speculative):
  the path for bundles exported before the sampler graphs, and the reference the graphs are tested against.
Both draw each request's uniforms from its own generator in the same order (decoding.speculative's
`draft_uniform` / `verify_uniforms`), so a seeded request gives the same tokens on either path, alone or
in any batch. Both keep the draft's q for the round's verification themselves (`begin_round` resets it).
"""

from __future__ import annotations

import numpy as np

from ..decoding.speculative import accept_drafts, draft_uniform, pick, verify_uniforms
from ..options import GenerationOptions
from ..runtime.buffers import Logits
from ..runtime.sampler import GraphSampler, Settings
from .request import Request

PATHS = ("graph", "host")


ALL_TOKENS = 2**31 - 1  # a top_k no vocabulary reaches (the graphs take int64: a client's 2**63 overflowed it)
_IDLE = GenerationOptions()  # a row that runs without drafting (a chain's idle slot): greedy, nothing drawn


def settings(rows: list[Request | None]) -> Settings | None:
    """The rows' sampling settings for the graphs (None: an idle row, greedy); None when every row is greedy
    (the greedy graphs take no settings and no uniforms: nothing to build per run)."""
    o = [_IDLE if r is None else r.options for r in rows]
    if all(x.greedy for x in o):
        return None
    return Settings(
        np.array([x.greedy for x in o], np.bool_),
        np.array([1.0 if x.greedy else x.temperature for x in o], np.float32),
        np.array([0 if x.greedy else min(x.top_k, ALL_TOKENS) for x in o], np.int64),  # any k past the vocab: all
        np.array([1.0 if x.greedy else x.top_p for x in o], np.float32),
    )


def leading_matches(drafted: list[int], target: list[int]) -> int:
    """How many drafts, from the first, equal the target's greedy tokens at their positions."""
    n = 0
    while n < len(drafted) and drafted[n] == target[n]:
        n += 1
    return n


class HostDecider:
    name = "host"
    seconds = 0.0  # inside ONNX Runtime: none (numpy decides)

    def __init__(self) -> None:
        self._q: dict[int, list[np.ndarray | None]] = {}  # slot -> the round's q per draft position

    def top(self, rows: list[Request], draft: bool) -> int:
        return 0  # it reads the logits themselves

    def begin_round(self, max_k: int, vocab: int) -> None:
        self._q.clear()

    def chain_picks(self, rows: list[Request | None], lo: int, hi: int) -> None:
        return None  # it picks from logits read back, one step at a time

    def pick(self, logits: Logits, rows: list[Request], step: int) -> tuple[list[int], list[float]]:
        tokens, confidences = [], []
        for r, row_logits in zip(rows, logits.rows(), strict=True):
            token, q, confidence = pick(row_logits[-1], r.options, draft_uniform(r.options, r.rng))
            self._q.setdefault(r.slot, []).append(q)
            tokens.append(token)
            confidences.append(confidence)
        return tokens, confidences

    def verify(
        self, logits: Logits, rows: list[Request], drafted: list[list[int]], lookup: list[bool]
    ) -> list[tuple[int, int]]:
        out = []
        for r, row_logits, d, ngram in zip(rows, logits.rows(), drafted, lookup, strict=True):
            q = [None] * len(d) if ngram else self._q.get(r.slot, [])[: len(d)]
            out.append(accept_drafts(row_logits, d, q, r.options, verify_uniforms(r.options, r.rng, len(d))))
        return out


class GraphDecider:
    name = "graph"

    def __init__(self, sampler: GraphSampler, draft_sampler: GraphSampler | None = None) -> None:
        """sampler: on the target's device (verifications); draft_sampler: on the draft's, where it has a
        device of its own (picks; it keeps the round's q), else the same one."""
        self.sampler = sampler
        self.draft_sampler = draft_sampler or sampler

    @property
    def seconds(self) -> float:
        """Inside ONNX Runtime (the sampler graphs), since load."""
        apart = self.draft_sampler is not self.sampler
        return self.sampler.seconds + (self.draft_sampler.seconds if apart else 0.0)

    def begin_round(self, max_k: int, vocab: int) -> None:
        self.draft_sampler.ensure_steps(max_k, vocab)

    def top(self, rows: list[Request], draft: bool) -> int:
        """What a model run over `rows` should compute beside its logits (ModelSession.run_logits' `top`):
        when every row is greedy, the greedy tokens, and for a draft step their probabilities (the early
        stop's signal); else nothing (the sampler graphs decide)."""
        return (2 if draft else 1) if all(r.options.greedy for r in rows) else 0

    def chain_picks(self, rows: list[Request | None], lo: int, hi: int):
        """The sampler's picks for a chain of draft steps over slots [lo, hi) holding `rows` (a request per
        slot, some sampled; None: idle), or None where the graphs cannot chain them (top-p; all greedy: those
        chain on the model's own picks)."""
        s = settings(rows)
        return None if s is None else self.draft_sampler.chain_picks(lo, hi, s)

    def uniforms(self, rows: list[Request | None], steps: int) -> np.ndarray:
        """The draft uniforms of the next `steps` steps [steps, rows], each row's drawn from its own generator
        in step order, as `pick` draws them one step at a time (an idle row's: 0, none drawn)."""
        u = [
            [0.0] * steps if r is None else [draft_uniform(r.options, r.rng) or 0.0 for _ in range(steps)] for r in rows
        ]
        return np.array(u, np.float32).T.copy()

    def pick(self, logits: Logits, rows: list[Request], step: int) -> tuple[list[int], list[float]]:
        if logits.confidences is not None:  # greedy rows: the model's run picked (one position per row)
            return list(logits.tokens), list(logits.confidences)
        s = settings(rows)
        u = None if s is None else np.array([draft_uniform(r.options, r.rng) or 0.0 for r in rows], np.float32)
        tokens, confidences = self.draft_sampler.pick(logits, s, u, [r.slot for r in rows], step)
        return tokens.tolist(), confidences.tolist()

    def verify(
        self, logits: Logits, rows: list[Request], drafted: list[list[int]], lookup: list[bool]
    ) -> list[tuple[int, int]]:
        if logits.tokens is not None:  # greedy rows: the longest prefix agreeing with the target's tokens
            out = []
            for start, d in zip(logits.starts, drafted, strict=True):
                target = logits.tokens[start : start + len(d) + 1]
                n = leading_matches(d, target)
                out.append((n, target[n]))
            return out
        s = settings(rows)
        u_accept = u_final = None
        if s is not None:  # greedy rows draw nothing (verify_uniforms returns None for them)
            width = max(1, max(len(d) for d in drafted))
            u_accept = np.zeros((len(rows), width), np.float32)
            u_final = np.zeros(len(rows), np.float32)
            for i, (r, d) in enumerate(zip(rows, drafted, strict=True)):
                u = verify_uniforms(r.options, r.rng, len(d))
                if u is not None:
                    u_accept[i, : len(d)], u_final[i] = u[:-1], u[-1]
        slots = [r.slot for r in rows]
        q = None
        if self.draft_sampler is not self.sampler and s is not None:  # the draft's q, on its own device
            self.draft_sampler.ensure_steps(1, logits.vocab)  # a request's first token: no round yet
            q = self.draft_sampler.q_rows(min(slots), max(slots) + 1, max(len(d) for d in drafted))
        n, nxt = self.sampler.verify(logits, drafted, s, lookup, slots, u_accept, u_final, q)
        return list(zip(n.tolist(), nxt.tolist(), strict=True))
