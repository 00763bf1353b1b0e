#!/usr/bin/env python
"""bench_batch's mixed prompts, 4 at a time, in an engine of 16 slots (as `specrt serve --max-batch 16`), plain
and auto k interleaved per part: each run's tokens/s, the median target pass of its full (4-row) plain rounds,
and the slot spans of its passes (rows, slots covered).

    python results/trust/slot-span/spans.py [BUNDLE-NAME] [CONCURRENCY]
"""

import collections
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_batch as bb  # noqa: E402
import benchkit as kit  # noqa: E402

import specrt  # noqa: E402
from specrt.engine import runner  # noqa: E402

log, spans = [], collections.Counter()
target_pass = runner.Runner.target_pass


def timed(self, rows):
    t0 = time.perf_counter()
    out = target_pass(self, rows)
    n, widest = len(rows), max(len(p.tokens) for _, p in rows)
    log.append((n, widest, 1000 * (time.perf_counter() - t0)))
    slots = [r.slot for r, _ in rows]
    spans[n, max(slots) - min(slots) + 1] += 1
    return out


runner.Runner.target_pass = timed
name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-native"
c = int(sys.argv[2]) if len(sys.argv) > 2 else 4
engine = specrt.load(ROOT / "engines" / name, bb.BUNDLES["draft"], max_batch=16)
bb.warm_up(engine, c)
prompts = list(enumerate(kit.mixed_prompts(4 * c)))
for part in range(4):
    jobs = prompts[part * c : (part + 1) * c]
    for config in kit.interleave({"plain": 0, "auto": None}, part):
        engine.reset()
        log.clear()
        spans.clear()
        got = bb.run_specrt(engine, c, bb.CONFIGS[config], 0.0, jobs)
        full = [ms for n, w, ms in log if n == c and w == 0]
        speed = sum(r["tokens"] for r in got["results"]) / got["wall"]
        median = f"{statistics.median(full):.1f} ms" if full else "-"
        print(f"part {part} {config}: {speed:.1f} tok/s, {c}-row plain target pass median {median} ({len(full)})")
        print(f"  passes by (rows, slots spanned): {dict(spans.most_common(5))}", flush=True)
