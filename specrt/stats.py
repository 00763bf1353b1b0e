"""Counters and timings of one generation, and the figures derived from them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Stats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens found in the KV slot it was given (not prefilled again)
    new_tokens: int = 0
    rounds: int = 0  # target passes after prefill (decode steps or verify passes)
    drafted: int = 0
    accepted: int = 0
    prefill_s: float = 0.0
    setup_s: float = 0.0  # cost models set up at admission: profiles read, or measured (the first auto-k
    # request on this machine: seconds; the summary names it from 0.1 s)
    draft_s: float = 0.0
    target_s: float = 0.0
    total_s: float = 0.0
    runtime_s: float = 0.0  # inside ONNX Runtime; the rest of total_s is the loop's Python and the caller's
    # own time between tokens (detokenising, stop strings, printing while streaming)
    k_histogram: Counter = field(default_factory=Counter)
    rounds_by_drafter: Counter = field(default_factory=Counter)  # "model/4", "ngram/3", "none/0" -> rounds
    finish_reason: str | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        """Mean tokens gained per verify pass: accepted drafts + the target's own token."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def overhead_ms_per_round(self) -> float:
        """Wall time outside ONNX Runtime per target pass (prefill included as one pass; profile
        measurement at admission left out)."""
        return 1000 * max(self.total_s - self.setup_s - self.runtime_s, 0.0) / (self.rounds + 1)

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.setup_s - self.prefill_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens after the first, over the time after prefill."""
        return (self.new_tokens - 1) / self.decode_s if self.new_tokens > 1 and self.decode_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "new_tokens": self.new_tokens,
            "finish_reason": self.finish_reason,
            "target_passes": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_target_pass": round(self.tokens_per_target_pass, 3),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "prefill_s": round(self.prefill_s, 4),
            "setup_s": round(self.setup_s, 4),
            "draft_s": round(self.draft_s, 4),
            "target_s": round(self.target_s, 4),
            "total_s": round(self.total_s, 4),
            "runtime_s": round(self.runtime_s, 4),
            "overhead_ms_per_round": round(self.overhead_ms_per_round, 3),
            "k_histogram": {str(k): v for k, v in sorted(self.k_histogram.items())},
            "rounds_by_drafter": dict(self.rounds_by_drafter),
        }

    def summary(self) -> str:
        return (
            f"{self.new_tokens} tokens in {self.total_s:.2f} s ({self.tokens_per_s:.1f} tok/s after a "
            f"{self.prefill_s * 1000:.0f} ms prefill of {self.prompt_tokens}"
            + (f", after {self.setup_s:.2f} s measuring cost profiles" if self.setup_s >= 0.1 else "")
            + f"), finish: {self.finish_reason}\n"
            f"target passes {self.rounds}, drafted {self.drafted}, accepted {self.accepted} "
            f"({100 * self.acceptance_rate:.1f}%), {self.tokens_per_target_pass:.2f} tokens/pass, "
            f"time draft {self.draft_s:.2f} s / target {self.target_s:.2f} s, "
            f"outside ONNX Runtime {self.overhead_ms_per_round:.2f} ms per round\n"
            f"k per round: {', '.join(f'{k}: {n}' for k, n in sorted(self.k_histogram.items()))}"
            + (f"; by drafter: {dict(self.rounds_by_drafter)}" if len(self.rounds_by_drafter) > 1 else "")
        )
