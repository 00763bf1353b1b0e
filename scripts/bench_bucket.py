#!/usr/bin/env python
"""What rounding the attended length T up to a bucket costs on the CPU: one bundle's forward passes with
attend_bucket 1 (exact T, the CPU's default) against 64 (a GPU's default), interleaved.

    python scripts/bench_bucket.py --target BUNDLE --out results/bucket-int4

A GPU wants a few fixed shapes (CUDA graphs, fp16 memory-efficient attention needs T % 4 == 0); on the CPU
the extra slots are only cost: up to bucket - 1 more keys per row and layer, masked. For rows B, new tokens
S and contexts c (each row holds c tokens, so T = c + S exact and the next multiple of the bucket
otherwise), the median time of one forward per setting, alternated ABBA over `--pairs`; the ratio bucketed
/ exact. Needs a bundle exported with the `attend_bucket` input (graph.attend_bucket in its manifest).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import benchkit as kit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--bucket", type=int, default=64)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    p.add_argument("--widths", type=int, nargs="+", default=[1, 5])
    p.add_argument("--contexts", type=int, nargs="+", default=[70, 200, 520, 1000])
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    from specrt.bundle.loading import open_bundle
    from specrt.runtime.session import ModelSession, SessionOptions

    bundle = open_bundle(args.target)
    if not bundle.manifest.graph.attend_bucket:
        raise SystemExit(f"{args.target}: exported before the attend_bucket input; export it again")
    sessions = {
        b: ModelSession(bundle, SessionOptions(intra_op_threads=args.threads, attend_bucket=b), rows=max(args.rows))
        for b in (1, args.bucket)
    }

    def forward(session, rows: int, context: int, width: int) -> float:
        for r in session.kv.rows[:rows]:
            r.reset()
            r.advance([0] * context)
        t0 = time.perf_counter()
        session.run_logits(list(range(rows)), [[1] * width] * rows, [width] * rows)
        return 1000 * (time.perf_counter() - t0)

    results = []
    for rows in args.rows:
        for width in args.widths:
            for context in args.contexts:
                got = {b: [] for b in sessions}
                for turn in range(2 * args.pairs + 2):
                    for b in kit.interleave(sessions, turn):
                        ms = forward(sessions[b], rows, context, width)
                        if turn >= 2:  # the first pair warms both
                            got[b].append(ms)
                exact, rounded = (statistics.median(got[b]) for b in sessions)
                t = context + width
                results.append(
                    {
                        "rows": rows,
                        "width": width,
                        "context": context,
                        "T": t,
                        "T_bucketed": -(-t // args.bucket) * args.bucket,
                        "exact_ms": exact,
                        "bucketed_ms": rounded,
                        "ratio": rounded / exact,
                    }
                )
                kit.log(
                    f"B {rows} S {width} context {context}: {exact:.1f} -> {rounded:.1f} ms ({rounded / exact:.3f})"
                )
    lines = [
        f"`{kit.command_line()}`",
        "",
        f"| rows | S | T exact | T bucketed ({args.bucket}) | ms exact | ms bucketed | bucketed / exact |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = [r["rows"], r["width"], r["T"], r["T_bucketed"], f"{r['exact_ms']:.1f}", f"{r['bucketed_ms']:.1f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + f" | {r['ratio']:.3f} |")
    ratios = [r["ratio"] for r in results]
    lines += ["", f"median ratio {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}"]
    md = "\n".join(lines) + "\n"
    kit.write_outputs(args.out, "bucket", md, {"command": kit.command_line(), "rows": results})


if __name__ == "__main__":
    main()
