"""c = 1 auto vs k = 3 on bench_batch's first 4 prompts; counts the rows' own choices (why)."""
import collections, sys, time
root = sys.argv[1]
sys.path.insert(0, root); sys.path.insert(0, "/work/main/scripts")
import specrt
from specrt.tuning import costmodel
import bench_batch as bb
whys = collections.Counter()
real = costmodel.CostModel.choose
def choose(self, *a, **k):
    c = real(self, *a, **k); whys[c.why] += 1; return c
costmodel.CostModel.choose = choose
print("specrt from", specrt.__file__)
engine = specrt.load(bb.BUNDLES["int4"], bb.BUNDLES["draft"], max_batch=1)
bb.warm_up(engine, 1)
steps = engine.tuning.steps
d = steps.profiles["draft"]
print("draft profile widths", d.widths, "contexts", d.contexts, "catch-up 20 tok ms", round(steps.catch_up_ms(20, 64), 1))
prompts = list(enumerate(bb.kit.mixed_prompts(4)))
for part in range(4):
    for name, k in (("auto", None), ("k=3", 3)):
        whys.clear()
        r = bb.run_specrt(engine, 1, k, 0.0, prompts[part:part + 1])
        s = bb.summary(r["results"], r["wall"])
        print(part + 1, name, round(s["total_tokens_per_s"], 1), dict(r["k_chosen"]), dict(whys), flush=True)
