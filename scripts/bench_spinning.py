#!/usr/bin/env python
"""How ONNX Runtime's thread spinning affects a target and a draft taking turns on the same cores.

    python scripts/bench_spinning.py [--target engines/qwen2.5-coder-1.5b-int4] [--draft ...] [--blocks 12]

Loads the pair three times in one process, once per spinning mode: spinning during runs only (what
`specrt.load` uses beside a draft), no spinning, and spinning throughout (ONNX Runtime's default). Each
mode then runs the same speculative-like rounds (3 draft steps, then 3-, 2- and 1-token target passes) in
interleaved blocks, so machine drift hits the modes alike (idle modes' threads sleep and do not interfere).
Prints median ms per pass kind and per round.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import benchkit as kit

from specrt.bundle.loading import open_bundle
from specrt.runtime.session import ModelSession, SessionOptions

MODES = {
    "spin during runs": SessionOptions(allow_spinning=True, spin_between_runs=False),
    "no spinning": SessionOptions(allow_spinning=False),
    "spin throughout": SessionOptions(allow_spinning=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=kit.ROOT / "engines/qwen2.5-coder-1.5b-int4")
    parser.add_argument("--draft", type=Path, default=kit.ROOT / "engines/qwen2.5-coder-0.5b-int4")
    parser.add_argument("--blocks", type=int, default=12, help="Interleaved blocks of 6 rounds per mode.")
    parser.add_argument("--context", type=int, default=300, help="Tokens prefilled before timing.")
    args = parser.parse_args()

    target, draft = open_bundle(args.target), open_bundle(args.draft)
    pairs = {mode: (ModelSession(target, o), ModelSession(draft, o)) for mode, o in MODES.items()}
    prompt = list(range(1000, 1000 + args.context))
    for t, d in pairs.values():
        t.forward(prompt)
        d.forward(prompt)
    times = {mode: {"draft 1": [], "target 3": [], "target 2": [], "target 1": [], "round": []} for mode in MODES}

    def timed(mode: str, kind: str, session: ModelSession, ids: list[int]) -> None:
        t0 = time.perf_counter()
        session.forward(ids, keep=len(ids))
        times[mode][kind].append(1000 * (time.perf_counter() - t0))

    for block in range(args.blocks):
        for mode in kit.interleave(MODES, block):
            t, d = pairs[mode]
            for _ in range(6):
                if t.kv.rows[0].free < 8 or d.kv.rows[0].free < 8:  # start over rather than overflow the buffers
                    t.kv.rows[0].rollback(t.kv.rows[0].length - len(prompt))
                    d.kv.rows[0].rollback(d.kv.rows[0].length - len(prompt))
                t0 = time.perf_counter()
                timed(mode, "draft 1", d, [5])
                timed(mode, "draft 1", d, [6])
                timed(mode, "target 3", t, [5, 6, 7])
                timed(mode, "draft 1", d, [7])
                timed(mode, "target 2", t, [8, 9])
                timed(mode, "target 1", t, [10])
                times[mode]["round"].append(1000 * (time.perf_counter() - t0))
    kinds = list(next(iter(times.values())))
    print(f"target {args.target.name}, draft {args.draft.name}: median ms")
    print(f"{'mode':<18}" + "".join(f"{k:>10}" for k in kinds))
    for mode, row in times.items():
        print(f"{mode:<18}" + "".join(f"{statistics.median(row[k]):10.1f}" for k in kinds))


if __name__ == "__main__":
    main()
