"""The engine's counters across all its requests: rounds, batch sizes, k, acceptance per position, queue
wait, tokens and finish reasons (`Engine.stats` and the server's /metrics read them). Per-generation
figures are specrt.stats.Stats."""

from __future__ import annotations

from collections import Counter


class EngineStats:
    """Counters of the whole engine (the server's /metrics reads them)."""

    def __init__(self) -> None:
        self.rounds = 0
        self.batch_sizes: Counter = Counter()  # running rows per round -> rounds
        self.k_chosen: Counter = Counter()  # k per row-round -> count
        self.drafts = 0  # row-rounds that drafted
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_per_position: Counter = Counter()  # draft position (1-based) -> accepted
        self.queue_wait_s: list[float] = []  # per admitted request (the last 1000)
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0  # of those, found in the slot's cache (not prefilled)
        self.generated_tokens = 0
        self.requests: Counter = Counter()  # finish reason -> requests

    def to_dict(self) -> dict:
        """A snapshot, safe to take from another thread (dict() copies are atomic under the GIL)."""
        waits = sorted(list(self.queue_wait_s))
        return {
            "rounds": self.rounds,
            "batch_sizes": dict(sorted(dict(self.batch_sizes).items())),
            "k_chosen": dict(sorted(dict(self.k_chosen).items())),
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_position": dict(sorted(dict(self.accepted_per_position).items())),
            "queue_wait_p50_s": waits[len(waits) // 2] if waits else 0.0,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "requests": dict(self.requests),
        }
