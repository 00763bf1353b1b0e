"""Two rows at once, int4 pair, one engine: auto k with and without the batch's probes against plain
batching and fixed k = 3, 5, on bench_batch's two c = 2 prompt pairs, in rotating order (drift hits all alike).

    python results/trust/batch-probe/pair.py [blocks]
"""

import sys
import threading
import time

sys.path.insert(0, "scripts")
import benchkit as kit  # noqa: E402

import specrt  # noqa: E402
from specrt import GenerationOptions  # noqa: E402

BLOCKS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
CONFIGS = {"plain": 0, "k=3": 3, "k=5": 5, "auto": None, "auto, no batch probes": None}
pairs = [kit.mixed_prompts(4)[0:2], kit.mixed_prompts(4)[2:4]]  # bench_batch's c = 2 parts
eng = specrt.load("engines/qwen2.5-coder-1.5b-int4", "engines/qwen2.5-coder-0.5b-int4", max_batch=2, threads=2)
eng.complete("def f(x):", GenerationOptions(max_new_tokens=4))  # builds the batch cost
cost = eng.scheduler.batch_cost
choose = cost.choose


def wave(name: str, pair) -> float:
    probes = name != "auto, no batch probes"
    cost.choose = choose if probes else (lambda *a: choose(*a[:7]))  # without `probing`
    cost.wait, cost.starved_rounds = (1 if probes else 1 << 30), 0
    before = dict(eng.stats["k_chosen"])
    options = GenerationOptions(max_new_tokens=128, num_draft_tokens=CONFIGS[name], ignore_eos=True)
    gens = [eng.generate(text, options, chat=chat) for text, chat, _ in pair]
    threads = [threading.Thread(target=g.consume) for g in gens]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0)
    ks = {j: c - before.get(j, 0) for j, c in eng.stats["k_chosen"].items() if c - before.get(j, 0)}
    print(f"  {name:22s} {rate:6.1f} tok/s  k {ks}", flush=True)
    return rate


names = list(CONFIGS)
for p, pair in enumerate(pairs):
    got = {n: [] for n in names}
    for b in range(BLOCKS):
        order = names[b % len(names) :] + names[: b % len(names)]
        print(f"pair {p + 1} ({', '.join(kind for _, _, kind in pair)}), block {b + 1}: {order}", flush=True)
        for n in order:
            got[n].append(wave(n, pair))
    mean = {n: sum(v) / len(v) for n, v in got.items()}
    best = max(mean[n] for n in ("plain", "k=3", "k=5"))
    print(f"pair {p + 1} means: " + ", ".join(f"{n} {m:.1f}" for n, m in mean.items()), flush=True)
    print(
        f"pair {p + 1}: auto / best fixed {mean['auto'] / best:.3f}, without batch probes "
        f"{mean['auto, no batch probes'] / best:.3f}",
        flush=True,
    )
