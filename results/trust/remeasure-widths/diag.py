"""c = 1 auto, k = 3 and k = 5 on bench_batch's first 4 prompts; counts the rows' own choices (why).

python results/trust/remeasure-widths/diag.py ROOT TEMPERATURE   (ROOT: the specrt source tree to load)
"""

import collections
import sys
from pathlib import Path

sys.path[:0] = [sys.argv[1], str(Path(__file__).resolve().parents[3] / "scripts")]

import bench_batch as bb  # noqa: E402

import specrt  # noqa: E402
from specrt.tuning import costmodel  # noqa: E402

whys = collections.Counter()
real = costmodel.CostModel.choose


def choose(self, *a, **k):
    c = real(self, *a, **k)
    whys[c.why] += 1
    return c


costmodel.CostModel.choose = choose
print("specrt from", specrt.__file__)
engine = specrt.load(bb.BUNDLES["int4"], bb.BUNDLES["draft"], max_batch=1)
bb.warm_up(engine, 1)
steps = engine.tuning.steps
d = steps.profiles["draft"]
print("draft profile widths", d.widths, "contexts", d.contexts, "catch-up 20:", round(steps.catch_up_ms(20, 64), 1))
prompts = list(enumerate(bb.kit.mixed_prompts(4)))
for part in range(4):
    for name, k in (("auto", None), ("k=3", 3), ("k=5", 5)):
        whys.clear()
        r = bb.run_specrt(engine, 1, k, float(sys.argv[2]), prompts[part : part + 1])
        s = bb.summary(r["results"], r["wall"])
        ks = {k: v for k, v in r["k_chosen"].items() if v}
        print(part + 1, name, round(s["total_tokens_per_s"], 1), ks, dict(whys), flush=True)
