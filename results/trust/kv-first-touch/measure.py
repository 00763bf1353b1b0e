#!/usr/bin/env python
"""A slot's first run against its later ones: the draft fed 192 tokens (three 64-token runs, as its catch-up feeds
them) in every slot, three passes, after bench_batch's warm-up (which runs the draft in one slot only).

    python results/trust/kv-first-touch/measure.py [target] [concurrency]

Prints the engine's load time and RSS, then per pass the milliseconds and minor page faults per slot.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_batch as bb  # noqa: E402
import benchkit as kit  # noqa: E402


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else "int4"
    c = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    import specrt

    t0 = time.perf_counter()
    engine = specrt.load(bb.BUNDLES[target], bb.BUNDLES["draft"], max_batch=c)
    kv = engine.target.kv.nbytes + engine.draft.kv.nbytes
    print(f"load {time.perf_counter() - t0:.2f} s, KV {kv / 2**20:.0f} MiB, RSS {kit.peak_rss_gib():.2f} GiB")
    bb.warm_up(engine, c)
    engine.reset()
    draft = engine.draft
    ids = [engine.encode(text, chat=chat) for text, chat, _ in kit.mixed_prompts(c)]
    tokens = [(list(x) * 200)[:192] for x in ids]
    for rep in range(3):
        ms, faulted = [], []
        for slot in range(c):
            draft.kv.rows[slot].reset()
            f0, t0 = faults(), time.perf_counter()
            for start in range(0, 192, 64):
                draft.run_logits([slot], [tokens[slot][start : start + 64]], [1])
            ms.append(1000 * (time.perf_counter() - t0))
            faulted.append(faults() - f0)
        print(f"pass {rep + 1}: ms per slot {' '.join(f'{m:.0f}' for m in ms)}; faults {' '.join(map(str, faulted))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
