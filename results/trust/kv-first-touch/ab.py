#!/usr/bin/env python
"""Resident KV buffers against lazily mapped ones, on later runs: two engines in one process, one with the KV
buffers of `np.zeros` (pages mapped at first use), one written at allocation, plain batching of the same prompts
alternating between them (ABBA), after a warm-up that brings every slot's pages in for both.

    python results/trust/kv-first-touch/ab.py [target] [concurrency] [repeats]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_batch as bb  # noqa: E402
import benchkit as kit  # noqa: E402

from specrt.runtime import kvcache  # noqa: E402


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else "int4"
    c = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    import specrt

    resident = kvcache._resident
    kvcache._resident = lambda shape, storage: np.zeros(shape, storage)
    engines = {"lazy": specrt.load(bb.BUNDLES[target], max_batch=c)}
    kvcache._resident = resident
    engines["resident"] = specrt.load(bb.BUNDLES[target], max_batch=c)
    jobs = list(enumerate(kit.mixed_prompts(c)))
    for engine in engines.values():
        bb.run_specrt(engine, c, 0, 0.0, jobs)  # every slot used once: its pages in, in both
    speeds: dict[str, list[float]] = {name: [] for name in engines}
    for rep in range(repeats):
        order = list(engines) if rep % 2 == 0 else list(reversed(engines))
        for name in order:
            engines[name].reset()
            got = bb.run_specrt(engines[name], c, 0, 0.0, jobs)
            speeds[name].append(sum(r["tokens"] for r in got["results"]) / got["wall"])
        print(f"repeat {rep + 1}: " + ", ".join(f"{n} {speeds[n][-1]:.1f} tok/s" for n in engines), flush=True)
    ratios = [r / z for r, z in zip(speeds["resident"], speeds["lazy"], strict=True)]
    per = " ".join(f"{x:.3f}" for x in ratios)
    print(f"{target} c={c} plain: resident / lazy per repeat {per}, median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
