#!/usr/bin/env python
"""A draft step run one at a time (auto k: the early stop reads each step's confidence) against k steps back to
back (fixed k): milliseconds per `Chain.run` call and per step, one request at a time, bench_batch's fourth
mixed prompt, 128 tokens, auto and k = 5 alternating, T = 0 and 0.7.

    python results/trust/batch-s33/draft_steps.py int4
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_batch as bb  # noqa: E402
import benchkit as kit  # noqa: E402

import specrt  # noqa: E402
from specrt.engine import runner  # noqa: E402
from specrt.runtime import chain  # noqa: E402
from specrt.tuning import costmodel  # noqa: E402

spent: dict[str, float] = collections.defaultdict(float)
calls: collections.Counter = collections.Counter()


def wrap(cls, name: str) -> None:
    method = getattr(cls, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0
            calls[name] += 1

    setattr(cls, name, timed)


for cls, name in ((costmodel.CostModel, "keep_drafting"), (chain.Chain, "run"), (runner.Runner, "propose")):
    wrap(cls, name)
wrap(runner.Runner, "target_pass")
engine = specrt.load(bb.BUNDLES[sys.argv[1]], bb.BUNDLES["draft"], max_batch=1)
bb.warm_up(engine, 1)
job = list(enumerate(kit.mixed_prompts(4)))[3:4]
for temperature in (0.0, 0.7):
    for k in (None, 5, None, 5):
        engine.reset()
        spent.clear()
        calls.clear()
        got = bb.run_specrt(engine, 1, k, temperature, job)
        per = {n: f"{calls[n]} calls, {1000 * spent[n] / max(calls[n], 1):.2f} ms each" for n in spent}
        print(f"T {temperature} k {k or 'auto'}: {got['wall']:.2f} s; {per}", flush=True)
