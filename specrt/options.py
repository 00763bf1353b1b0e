"""Generation options: what to produce and how to sample it. Frozen, validated, independent of engines."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import OptionsError

_STOP = "a string or a list of non-empty strings"
# The graphs divide float32 logits by the temperature: past these bounds it is not a float32 that keeps the
# quotient finite and non-zero (1e-300 became 0 there, logits / 0 = inf and a NaN distribution; 1e300 became inf).
TEMPERATURES = (1e-30, 1e30)
_TEMPERATURE = f"a finite number >= 0 (0: greedy) and, unless 0, within [{TEMPERATURES[0]:g}, {TEMPERATURES[1]:g}]"


@dataclass(frozen=True)
class GenerationOptions:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no top-k
    top_p: float = 1.0  # 1: no top-p
    seed: int | None = None
    num_draft_tokens: int | None = None  # k; None: chosen each round by the cost model; 0: target-only
    max_draft_tokens: int = 8  # the largest k the cost model may choose
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, (list, tuple)):
            object.__setattr__(self, "stop", tuple(self.stop))
        checks = [
            ("max_new_tokens", _is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "an integer >= 1"),
            (
                "temperature",
                _is_num(self.temperature)
                and (self.temperature == 0 or TEMPERATURES[0] <= self.temperature <= TEMPERATURES[1]),
                _TEMPERATURE,
            ),
            ("top_k", _is_int(self.top_k) and self.top_k >= 0, "an integer >= 0 (0 disables it)"),
            ("top_p", _is_num(self.top_p) and 0 < self.top_p <= 1, "in (0, 1] (1 disables it)"),
            ("seed", self.seed is None or _is_int(self.seed) and self.seed >= 0, "an integer >= 0"),
            (
                "num_draft_tokens",
                self.num_draft_tokens is None or _is_int(self.num_draft_tokens) and 0 <= self.num_draft_tokens <= 64,
                "'auto' (None) or an integer in 0..64 (0 turns speculation off)",
            ),
            ("max_draft_tokens", _is_int(self.max_draft_tokens) and 1 <= self.max_draft_tokens <= 64, "in 1..64"),
            ("stop", isinstance(self.stop, tuple) and all(isinstance(s, str) and s for s in self.stop), _STOP),
            ("ignore_eos", isinstance(self.ignore_eos, bool), "True or False"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise OptionsError(f"{name} must be {expected}; got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: object) -> bool:
    """A real number, finite: NaN and the infinities are refused (an infinite temperature is no setting)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond any float
        return False
