"""Prompt lookup (n-gram drafting): proposals continued from an earlier occurrence of the sequence's tail.

Its proposals are deterministic (q None, which the acceptance test treats as one-hot) and cost no forward,
so the scheduler looks them up once per round, before choosing k (their length caps k). The draft model,
the other drafter, is run by runner.py as batched steps over the rows that draft. Drafters know nothing
about the target.
"""

from __future__ import annotations

import numpy as np


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens (longest n first)
    that is followed by k tokens, and propose them. Free to compute; strong when the output copies the
    input (edits, code)."""

    name = "ngram"

    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n

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
