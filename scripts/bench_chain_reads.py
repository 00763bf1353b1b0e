#!/usr/bin/env python
"""What the early stop's read per draft step costs: a chain of k draft steps run back to back (one read at
the end, as at a fixed k) against the same steps one at a time (a read after each, as under auto k).

    python scripts/bench_chain_reads.py                     # the 0.5B int4 draft, 1 and 4 rows, k = 4

Host time (wall - inside ONNX Runtime) per chain of k steps, medians of interleaved (ABBA) pairs after two
warm-up pairs. The difference is the most that moving the early-stop rule into a graph could save per round.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import benchkit as kit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", type=Path, default=kit.ROOT / "engines/qwen2.5-coder-0.5b-int4")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--pairs", type=int, default=12)
    args = p.parse_args()
    from specrt.bundle.loading import open_bundle
    from specrt.runtime.session import ModelSession, SessionOptions

    session = ModelSession(open_bundle(args.draft), SessionOptions(), rows=max(args.rows))
    print(f"`{kit.command_line()}`\n")
    print(f"| rows | host ms per {args.k} steps, back to back | one at a time | per extra read | step in ORT, ms |")
    print("|---|---|---|---|---|")
    for rows in args.rows:
        session.run_logits(list(range(rows)), [[1] * 40] * rows, [1] * rows)  # a 40-token context per row
        chain = session.chain(0, rows)
        got, inside = {"together": [], "apart": []}, []
        for turn in range(args.pairs):
            for how in kit.interleave(got, turn):
                for row in session.kv.rows[:rows]:
                    row.truncate(40)
                s0, t0 = session.seconds, time.perf_counter()
                chain.start([[5]] * rows, args.k)
                for n in [args.k] if how == "together" else [1] * args.k:
                    chain.run(n)
                got[how].append(1000 * ((time.perf_counter() - t0) - (session.seconds - s0)))
                inside.append(1000 * (session.seconds - s0) / args.k)
        together, apart = (statistics.median(got[h][4:]) for h in ("together", "apart"))
        extra = (apart - together) / (args.k - 1)
        print(f"| {rows} | {together:.3f} | {apart:.3f} | {extra:.3f} | {statistics.median(inside):.1f} |")


if __name__ == "__main__":
    main()
