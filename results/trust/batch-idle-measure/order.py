"""auto vs plain at 8 rows, same engine, in both orders and after k = 5 (bench_batch's c = 8 gap)."""

import json
import threading
import time

import specrt
from specrt import GenerationOptions

prompts = [p["ids"] for p in json.load(open("results/prompts.json"))][:8]
eng = specrt.load("engines/qwen2.5-coder-1.5b-int4", "engines/qwen2.5-coder-0.5b-int4", max_batch=8, threads=2)


def wave(k):
    before = dict(eng.stats["k_chosen"])
    options = GenerationOptions(max_new_tokens=128, num_draft_tokens=k, ignore_eos=True)
    gens = [eng.generate(p, options) for p in prompts]
    threads = [threading.Thread(target=g.consume) for g in gens]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    eng.reset()
    n = sum(len(g.token_ids) for g in gens)
    ks = {j: c - before.get(j, 0) for j, c in eng.stats["k_chosen"].items() if c - before.get(j, 0)}
    name = "auto" if k is None else f"k={k}"
    print(f"{name:6s} {n / dt:6.1f} tok/s  k {ks}", flush=True)


wave(0)
for k in (0, None, None, 0, 5, None, 0, 5, 0, None, None, 0):
    wave(k)
