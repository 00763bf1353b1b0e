"""A fresh engine's first requests (after bench_ab's 16-token warm-up): what auto k saw each round, int4 pair.

    python results/trust/busy-profile-s35/first_request_trace.py [prompt ...]   # default: code-complete-sort

Per request: tok/s, k per round, accepted / drafted; per round (the first 12, then every 10th): the chosen k, why,
the stretch, tokens per second by k (x 1000 of the model's tokens / ms), the target's priced ms by width, and the
acceptance estimate of positions 1-6.
"""

import sys
from pathlib import Path

import specrt
from specrt.prompts import DEFAULT_PROMPTS
from specrt.tuning import costmodel
from specrt.tuning.stepcost import TARGET

ROOT = Path(__file__).resolve().parents[3]

log = []
orig = costmodel.CostModel.choose


def choose(self, k_cap, context, alone=True, missed=0, remaining=None):
    c = orig(self, k_cap, context, alone, missed, remaining)
    if self.drafter == costmodel.MODEL:
        rates = {k: round(self.tokens_per_ms(k, context) * 1000, 2) for k in range(min(k_cap, 8) + 1)}
        ms = {w: round(self.steps.ms(TARGET, w, context), 1) for w in (1, 2, 3, 5, 9)}
        acc = [round(a, 3) for a in self.acceptance.rates(6)]
        log.append((c.k, c.why, getattr(c, "stretch", None), rates, ms, acc))
    return c


costmodel.CostModel.choose = choose

engine = specrt.load(ROOT / "engines/qwen2.5-coder-1.5b-int4", ROOT / "engines/qwen2.5-coder-0.5b-int4")
engine.complete("def warm_up():", specrt.GenerationOptions(max_new_tokens=16, ignore_eos=True))
log.clear()
names = sys.argv[1:] or ["code-complete-sort"]
P = {p.name: p for p in DEFAULT_PROMPTS}
for rep in range(2):
    for name in names:
        p = P[name]
        engine.reset()
        ids = engine.encode(p.text, chat=p.chat)
        log.clear()
        g = engine.complete(ids, specrt.GenerationOptions(max_new_tokens=128, ignore_eos=True))
        s = g.stats
        print(
            f"rep {rep} {name}: {s.new_tokens / s.total_s:.2f} tok/s, k {dict(s.k_histogram)},"
            f" acc {s.accepted}/{s.drafted}"
        )
        for i, row in enumerate(log):
            if i < 12 or i % 10 == 0:
                print("  ", i, row)
