"""c = 1 on bench_batch's 4 prompts: auto with several `Policy.stretch` values (sN) against fixed k (kN),
interleaved prompt by prompt in one engine, a seed per repeat.

    python results/trust/acceptance-stretch/diag4.py ROOT TEMPERATURE REPEATS s0,s2,k3,k5
"""

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path[:0] = [sys.argv[1], str(Path(__file__).resolve().parents[3] / "scripts")]

import bench_batch as bb  # noqa: E402

import specrt  # noqa: E402

T, REPS, CONFIGS = float(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
engine = specrt.load(bb.BUNDLES["int4"], bb.BUNDLES["draft"], max_batch=1)
bb.warm_up(engine, 1)
base = engine.tuning.policy
prompts = bb.kit.mixed_prompts(4)
res = {}
for rep in range(REPS):
    for part, (text, chat, _) in enumerate(prompts):
        line = []
        for c in CONFIGS:
            k = int(c[1:]) if c.startswith("k") else None
            if k is None:
                engine.tuning.policy = replace(base, stretch=int(c[1:]))
            opts = specrt.GenerationOptions(
                max_new_tokens=bb.NEW_TOKENS, num_draft_tokens=k, temperature=T, seed=100 * rep + part, ignore_eos=True
            )
            t0 = time.perf_counter()
            gen = engine.generate(text, opts, chat=chat)
            for _ in gen:
                pass
            tps = len(gen.token_ids) / (time.perf_counter() - t0)
            res.setdefault((part, c), []).append(tps)
            line.append(f"{c} {tps:5.1f}")
        print(rep, part + 1, "  ".join(line), flush=True)
for part in range(len(prompts)):
    med = {c: statistics.median(res[(part, c)]) for c in CONFIGS}
    best = max(v for c, v in med.items() if c.startswith("k"))
    auto = {c: round(v / best, 3) for c, v in med.items() if c.startswith("s")}
    print("part", part + 1, {c: round(v, 1) for c, v in med.items()}, "auto/best fixed", auto)
