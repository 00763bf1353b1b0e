#!/usr/bin/env python
"""Host time around one model run: what a decode step costs outside ONNX Runtime, and why it grows with the model.

    python scripts/bench_run_overhead.py engines/qwen2.5-coder-0.5b-int4 [more bundles...]

For each bundle, a 1-token decode step at batch 1 is run N times through `ModelSession.run_logits` (the
runtime's own call) and timed in three parts: before ONNX Runtime starts (building and binding the inputs),
inside it, and after it returns (bookkeeping). Then the same fixed piece of pure Python (a 200-step loop)
is timed three ways: alone in a loop (warm caches), right after each model run, and right after a 10 ms
sleep. Read together they say how much of the host time per run is the code's own work and how much is
that work running on caches a model run has just flushed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def fixed_work() -> int:
    x, d = 0, {}
    for i in range(200):
        x += i * 2
        d[i % 7] = x
    return x


def measure(path: Path, n: int) -> None:
    from specrt.bundle.loading import open_bundle
    from specrt.runtime.session import ModelSession

    s = ModelSession(open_bundle(path), rows=8)
    s.run_logits([0], [[1, 2, 3, 4, 5]], [1])
    marks: dict[str, float] = {}
    run = s.session.run_with_iobinding

    def timed_run(io) -> None:
        marks["start"] = time.perf_counter()
        run(io)
        marks["end"] = time.perf_counter()

    s.session.run_with_iobinding = timed_run
    before = inside = after = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        s.run_logits([0], [[7]], [1])
        t1 = time.perf_counter()
        before += marks["start"] - t0
        inside += marks["end"] - marks["start"]
        after += t1 - marks["end"]
        s.kv.rows[0].rollback(1)
    s.session.run_with_iobinding = run
    work = {"warm": 0.0, "after a model run": 0.0, "after a 10 ms sleep": 0.0}
    for _ in range(n):
        t0 = time.perf_counter()
        fixed_work()
        work["warm"] += time.perf_counter() - t0
        s.run_logits([0], [[7]], [1])
        s.kv.rows[0].rollback(1)
        t0 = time.perf_counter()
        fixed_work()
        work["after a model run"] += time.perf_counter() - t0
        time.sleep(0.01)
        t0 = time.perf_counter()
        fixed_work()
        work["after a 10 ms sleep"] += time.perf_counter() - t0
    us = 1e6 / n
    print(
        f"{path}: decode step at batch 1: {before * us:.0f} us before ONNX Runtime, {inside * us:.0f} us inside, "
        f"{after * us:.0f} us after; fixed Python work: " + ", ".join(f"{k} {v * us:.1f} us" for k, v in work.items())
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundles", type=Path, nargs="+")
    p.add_argument("-n", type=int, default=200, help="runs per measurement")
    args = p.parse_args()
    for path in args.bundles:
        measure(path, args.n)


if __name__ == "__main__":
    main()
