"""c = 1 on bench_batch's first 4 prompts, auto and k = 5 alternating: auto's chosen k, its early stops, its
acceptance estimates and the learned step costs.

    python results/trust/remeasure-widths/diag2.py ROOT TEMPERATURE   (ROOT: the specrt source tree to load)
"""

import collections
import sys
from pathlib import Path

sys.path[:0] = [sys.argv[1], str(Path(__file__).resolve().parents[3] / "scripts")]

import bench_batch as bb  # noqa: E402

import specrt  # noqa: E402
from specrt.tuning import costmodel  # noqa: E402

chosen, stops, est = collections.Counter(), collections.Counter(), []
real_choose, real_keep = costmodel.CostModel.choose, costmodel.CostModel.keep_drafting


def choose(self, k_cap, context, *a, **kw):
    c = real_choose(self, k_cap, context, *a, **kw)
    chosen[(c.k, c.why)] += 1
    est.append([round(x, 2) for x in self.acceptance.rates(5)])
    return c


def keep(self, confidences, k, context):
    go = real_keep(self, confidences, k, context)
    if not go and len(confidences) < k:
        stops[(len(confidences), k)] += 1
    return go


costmodel.CostModel.choose, costmodel.CostModel.keep_drafting = choose, keep
engine = specrt.load(bb.BUNDLES["int4"], bb.BUNDLES["draft"], max_batch=1)
bb.warm_up(engine, 1)
prompts = list(enumerate(bb.kit.mixed_prompts(4)))
T = float(sys.argv[2])
for part in range(4):
    for name, k in (("auto", None), ("k=5", 5)):
        chosen.clear()
        stops.clear()
        est.clear()
        r = bb.run_specrt(engine, 1, k, T, prompts[part : part + 1])
        s = bb.summary(r["results"], r["wall"])
        print(part + 1, name, round(s["total_tokens_per_s"], 1), {k: v for k, v in r["k_chosen"].items() if v})
        if k is None:
            print("   chosen", dict(chosen))
            print("   early stops (after j of k)", dict(stops))
            print("   a_1..a_5 at rounds 1, 10, 20, last:", [est[i] for i in (0, 9, 19, -1) if i < len(est)])
            steps = engine.tuning.steps
            ratios = {f"{a}/{b}": round(v, 3) for (a, b), v in steps.ratios.items()}
            print("   speed", round(steps.speed, 3), "ratios", ratios, flush=True)
