"""Two rows at once, int4 pair, one engine: plain batching, fixed k = 3 and auto k with the acceptance
estimate's prior worth two rounds (the default) and one (tried), on bench_batch's two c = 2 prompt pairs,
in rotating order (drift hits all alike).

    python results/trust/batch-probe-width/pair.py [blocks] [temperature]
"""

import statistics
import sys

sys.path.insert(0, "scripts")
import bench_batch  # noqa: E402
import benchkit as kit  # noqa: E402

import specrt  # noqa: E402
from specrt import GenerationOptions  # noqa: E402
from specrt.tuning import costmodel  # noqa: E402

BLOCKS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
TEMPERATURE = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
CONFIGS = {"plain": (0, 2.0), "k=3": (3, 2.0), "auto, prior worth 1": (None, 1.0), "auto": (None, 2.0)}
weight = [2.0]
for_request = costmodel.Tuning.for_request


def weighted(self, drafters):  # each request's acceptance estimate with the wave's prior weight
    costs = for_request(self, drafters)
    for model in costs.models.values():
        model.acceptance.prior_weight = weight[0]
    return costs


costmodel.Tuning.for_request = weighted
pairs = [kit.mixed_prompts(4)[0:2], kit.mixed_prompts(4)[2:4]]  # bench_batch's c = 2 parts
eng = specrt.load("engines/qwen2.5-coder-1.5b-int4", "engines/qwen2.5-coder-0.5b-int4", max_batch=2, threads=2)
eng.complete("def f(x):", GenerationOptions(max_new_tokens=4))  # builds the batch cost


def wave(name: str, pair, seed: int) -> float:
    """One wave of the pair's two requests at once under configuration `name` (bench_batch's own part)."""
    k, weight[0] = CONFIGS[name]
    got = bench_batch.run_specrt(eng, 2, k, TEMPERATURE, list(enumerate(pair, start=seed)))
    rate = sum(r["tokens"] for r in got["results"]) / got["wall"]
    ks = {j: n for j, n in got["k_chosen"].items() if n}
    print(f"  {name:20s} {rate:6.1f} tok/s  k {ks}", flush=True)
    return rate


names = list(CONFIGS)
for p, pair in enumerate(pairs):
    got = {n: [] for n in names}
    for b in range(BLOCKS):
        order = names[b % len(names) :] + names[: b % len(names)]
        print(f"pair {p + 1} ({', '.join(kind for _, _, kind in pair)}), block {b + 1}: {order}", flush=True)
        for n in order:
            got[n].append(wave(n, pair, 2 * p))
    mean = {n: statistics.mean(v) for n, v in got.items()}
    best = max(mean["plain"], mean["k=3"])
    print(f"pair {p + 1} means: " + ", ".join(f"{n} {m:.1f}" for n, m in mean.items()), flush=True)
    print(
        f"pair {p + 1}: auto / best fixed {mean['auto'] / best:.3f}, "
        f"with the prior worth 1 {mean['auto, prior worth 1'] / best:.3f}",
        flush=True,
    )
