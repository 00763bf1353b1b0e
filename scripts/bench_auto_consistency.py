#!/usr/bin/env python
"""Does auto k choose the same way in fresh engines under the same load? Fresh engines (the int4 pair,
max_batch 4, 2 threads), each running 3 waves of 4 concurrent 48-token greedy requests (the default prompts),
auto k then fixed k = 0 then fixed k = 3, repeated: tok/s and the k chosen per row-round of each engine.

    python scripts/bench_auto_consistency.py --repeats 3
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import specrt
from specrt import GenerationOptions
from specrt.prompts import DEFAULT_PROMPTS


def run(target: str, draft: str, k: int | None, waves: int = 3, rows: int = 4, tokens: int = 48) -> dict:
    engine = specrt.load(target, draft, max_batch=rows, threads=2)
    options = GenerationOptions(max_new_tokens=tokens, num_draft_tokens=k, ignore_eos=True)
    prompts = [p.text for p in DEFAULT_PROMPTS]
    start, generated = time.perf_counter(), 0
    with ThreadPoolExecutor(rows) as pool:
        for wave in range(waves):
            wave_prompts = [prompts[(i + wave) % len(prompts)] for i in range(rows)]
            outs = pool.map(lambda p: engine.complete(p, options), wave_prompts)
            generated += sum(len(o.token_ids) for o in outs)
    seconds = time.perf_counter() - start
    stats = engine.stats if isinstance(engine.stats, dict) else engine.stats()
    drafted = stats["draft_tokens"]
    return {
        "tok_s": generated / seconds,
        "k_chosen": stats["k_chosen"],
        "acceptance": stats["accepted_tokens"] / drafted if drafted else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="engines/qwen2.5-coder-1.5b-int4")
    parser.add_argument("--draft", default="engines/qwen2.5-coder-0.5b-int4")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for repeat in range(args.repeats):
        cells = {name: run(args.target, args.draft, k) for name, k in (("auto", None), ("k=0", 0), ("k=3", 3))}
        best = max(cells["k=0"]["tok_s"], cells["k=3"]["tok_s"])
        for name, c in cells.items():
            print(f"{repeat} {name:4} {c['tok_s']:5.1f} tok/s  k chosen {c['k_chosen']}  acceptance {c['acceptance']}")
        print(f"{repeat} auto / best fixed = {cells['auto']['tok_s'] / best:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
