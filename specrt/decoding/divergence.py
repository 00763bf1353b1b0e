"""Where two greedy outputs part, and whether that is a near-tie of the target or a real difference.

Greedy speculative output equals target-only output token for token on an exact target; on a quantized
one (MatMulNBits at accuracy level 4) a 1-token step and a verify pass round their sums differently, so
at a near-tie of the target's top two logits the two outputs may part. Measured on the real int4 and
native 1.5B bundles: every difference at a top-2 margin of 0.003-0.214. Above `NEAR_TIE` a difference
is a bug.

`divergence` runs the target once (any object with `kv.rows[0]` and `forward(ids, keep)`: a
ModelSession), so this module needs no runtime import.
"""

from __future__ import annotations

import numpy as np

# The one threshold, stated once (README, bench, tests read it from here): measured divergences of
# quantized targets reach ~0.21; 0.25 leaves a margin above them and far below a clear choice.
NEAR_TIE = 0.25


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two token lists differ (the shorter's length if one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def top2_margin(logits: np.ndarray) -> float:
    top2 = np.sort(logits)[-2:]
    return float(top2[1] - top2[0])


def divergence(session, prompt_ids: list[int], a: list[int], b: list[int]) -> dict:
    """First position where two greedy outputs differ, and the top-2 logit margin there of `session` (the
    target) after prompt + the common prefix. Its slot 0 is left empty."""
    pos = first_difference(a, b)
    row = session.kv.rows[0]
    row.reset()
    logits = session.forward(prompt_ids + a[:pos], keep=1)[-1]
    row.reset()
    return {"position": pos, "top2_margin": top2_margin(logits)}
