"""Where draft tokens come from: a draft model, or prompt lookup (n-gram) over the sequence so far.

The draft model proposes k tokens after `tokens` and, for each, the distribution q it was drawn from;
prompt lookup's proposals are deterministic (q None, which the acceptance test treats as one-hot), and
the speculator looks them up once per round, before choosing k, since their length caps k. The acceptance maths
is the same for both, so both are lossless. Drafters know nothing about the target.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .session import ModelSession

# pick(logits) -> (token, q): argmax and None when greedy; a sample and its warped distribution otherwise.
Pick = Callable[[np.ndarray], tuple[int, np.ndarray | None]]


class ModelDrafter:
    """k autoregressive steps of a small model; its cache catches up on whatever it has not seen."""

    name = "model"

    def __init__(self, session: ModelSession):
        self.session = session
        self.last_step_ms: float | None = None  # mean forward time of the last proposal's drafting steps
        self.last_confidences: list[float] = []  # the draft's probability of each token of the last proposal

    def capacity(self, length: int) -> int:
        # The draft holds everything but its last proposal: length + k - 1 <= max_len.
        return self.session.max_len - length + 1

    def behind(self, length: int) -> int:
        """Tokens its first forward must feed: 1 (or 2 after a full acceptance) when it kept up."""
        return length - self.session.kv.length

    def propose(
        self, tokens: list[int], k: int, pick: Pick, more: Callable[[list[float]], bool] | None = None
    ) -> tuple[list[int], list[np.ndarray | None]]:
        """Up to k drafts and the distribution each was drawn from. With `more`, drafting stops early once
        more(confidences) says so, given the draft's probability of each token drafted so far (also kept
        in last_confidences). The stop depends on the draft alone, so verification stays exact."""
        drafted: list[int] = []
        q: list[np.ndarray | None] = []
        self.last_confidences = []
        feed = tokens[self.session.kv.length :]  # the last token, or more after a full acceptance
        step_s, steps = 0.0, 0
        for _ in range(k):
            if drafted and more is not None and not more(self.last_confidences):
                break
            t0 = time.perf_counter()
            logits = self.session.forward(feed, keep=1)[-1]
            # The price of a drafted token is a 1-2 token forward; catching up on a longer stretch (the
            # prompt, or text that prompt lookup drafted) is a one-time cost and must not inflate it.
            if len(feed) <= 2:
                step_s, steps = step_s + time.perf_counter() - t0, steps + 1
            token, probs = pick(logits)
            if more is not None:
                self.last_confidences.append(float(probs[token]) if probs is not None else _top_probability(logits))
            drafted.append(token)
            q.append(probs)
            feed = [token]
        self.last_step_ms = 1000 * step_s / steps if steps else None
        return drafted, q

    def keep(self, length: int) -> None:
        self.session.kv.truncate(length)


def _top_probability(logits: np.ndarray) -> float:
    """softmax(logits).max() = 1 / sum(exp(logits - max)), without building the distribution."""
    x = logits.astype(np.float32, copy=False)
    return float(1.0 / np.exp(x - x.max()).sum())


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens (longest n first)
    that is followed by k tokens, and propose them. Free to compute; strong when the output copies the
    input (edits, code)."""

    name = "ngram"
    last_step_ms = None  # proposals cost no forward
    last_confidences = None  # nor carry a probability

    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n

    def capacity(self, length: int) -> int:
        return 1 << 30

    def behind(self, length: int) -> int:
        return 0  # nothing to catch up on

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        seq = np.asarray(tokens, dtype=np.int64)
        length = len(seq)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            # Candidate starts i < length - n with seq[i:i+n] == suffix; vectorised over i.
            hit = seq[: length - n] == seq[length - n]
            for j in range(1, n):
                hit &= seq[j : length - n + j] == seq[length - n + j]
            starts = np.flatnonzero(hit)
            if starts.size:
                # The most recent match that has k tokens after it; failing that, the one with the most
                # (in a run of one repeated token, the latest match has just one token after it).
                full = starts[starts <= length - n - k]
                start = int(full[-1] if full.size else starts[0]) + n
                return seq[start : start + k].tolist()
        return []

    def keep(self, length: int) -> None:
        pass
