#!/usr/bin/env python
"""The two graph flavours side by side: GroupQueryAttention (gqa) against standard ONNX operators (standard).

    python scripts/bench_graph.py --out results/graph          # about 25 minutes on 2 cores

For the 1.5B target and the 0.5B draft, fp32 and int4 (block 32), each exported in both flavours from the
same GGUF (into engines/graphs/, skipped when present), this measures one forward of S new tokens:
- batch 1: S = 1..9 at contexts 64, 512 and 2048, both flavours timed alternately (ABBA) point by point,
  so that drift on a shared machine hits both alike; reported as medians and standard / gqa ratios;
- batch rows (standard only: GroupQueryAttention refuses several rows once S > 1): B = 2, 4, 8 rows at
  context 512 with S = 1 and S = 4 new tokens each, against B = 1 in the same rounds.
Writes <out>/graph.json and <out>/graph.md; the decision rule of the README (one flavour if standard is
within 5% of gqa on every batch-1 point) is evaluated at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import benchkit as kit

CONTEXTS = (64, 512, 2048)
WIDTHS = tuple(range(1, 10))
BATCHES = (2, 4, 8)


def bundle(role: str, precision: str, flavour: str) -> Path:
    """flavour: gqa, standard (int4 as MatMulNBits), or standard-qdq (int4 as DequantizeLinear + MatMul)."""
    quant = ["--quant", "none", "--lm-head", "fp32"] if precision == "fp32" else ["--quant", "int4"]
    graph, _, form = flavour.partition("-")
    flags = ["--graph", graph, *quant, "--weights", form or "nbits"]
    return kit.export_bundle(role, kit.ROOT / "engines/graphs" / f"{role}-{precision}-{flavour}", flags)


def forward_ms(session, slots: list[int], context: int, width: int) -> float:
    for s in slots:
        session.kv.rows[s].reset()
        session.kv.rows[s].advance([0] * context)
    t0 = time.perf_counter()
    session.run(slots, [[0] * width] * len(slots), [1] * len(slots))
    return 1000 * (time.perf_counter() - t0)


def measure(role: str, precision: str, reps: int) -> dict:
    from specrt.bundle.loading import open_bundle
    from specrt.runtime.session import ModelSession, SessionOptions

    options = SessionOptions(spin_between_runs=False)
    gqa = ModelSession(open_bundle(bundle(role, precision, "gqa")), options)
    std = ModelSession(open_bundle(bundle(role, precision, "standard")), options, rows=max(BATCHES))
    flavours = [("gqa", gqa), ("standard", std)]
    if precision == "int4":  # the same blocks as standard ops: does ONNX Runtime's fusion keep the speed?
        flavours.append(("standard-qdq", ModelSession(open_bundle(bundle(role, precision, "standard-qdq")), options)))
    points = [(c, w) for c in CONTEXTS for w in WIDTHS]
    single = {(f, c, w): [] for f, _ in flavours for c, w in points}
    batched = {(b, w): [] for b in (1, *BATCHES) for w in (1, 4)}
    for rep in range(reps + 1):
        kit.log(f"{role} {precision}: round {rep}/{reps}")
        for c, w in kit.interleave(points, rep + 1):
            for name, session in kit.interleave(flavours, rep + w + 1):
                t = kit.timed_forward(session, c, w, keep=1)
                if rep:
                    single[name, c, w].append(t)
        for b, w in batched:
            t = forward_ms(std, list(range(b)), 512, w)
            if rep:
                batched[b, w].append(t)
    del gqa, std, flavours
    med = {k: statistics.median(v) for k, v in single.items()}
    return {
        "role": role,
        "precision": precision,
        "batch1": [
            {"context": c, "S": w, "gqa_ms": med["gqa", c, w], "standard_ms": med["standard", c, w]}
            | ({"qdq_ms": med["standard-qdq", c, w]} if precision == "int4" else {})
            for c, w in points
        ],
        "batched": [{"B": b, "S": w, "ms": statistics.median(v)} for (b, w), v in batched.items()],
    }


def report(results: list[dict], command: str) -> str:
    md = [f"Command: `{command}`", "", "Batch 1, ms per forward (median), standard / gqa:", ""]
    md.append("| model | context | " + " | ".join(f"S={w}" for w in WIDTHS) + " |")
    md.append("|---" * (len(WIDTHS) + 2) + "|")
    worst = []
    for r in results:
        for c in CONTEXTS:
            cells = []
            for p in (p for p in r["batch1"] if p["context"] == c):
                ratio = p["standard_ms"] / p["gqa_ms"]
                worst.append((ratio, f"{r['role']} {r['precision']} context {c} S={p['S']}"))
                cells.append(f"{p['gqa_ms']:.1f} / {p['standard_ms']:.1f} ({ratio:.2f})")
            md.append(f"| {r['role']} {r['precision']} | {c} | " + " | ".join(cells) + " |")
    md += ["", "Cells: gqa ms / standard ms (ratio).", ""]
    md += ["Batch rows, standard graph, context 512: ms per forward (per row):", ""]
    md.append("| model | S | B=1 | " + " | ".join(f"B={b}" for b in BATCHES) + " |")
    md.append("|---" * (len(BATCHES) + 3) + "|")
    for r in results:
        for w in (1, 4):
            row = {p["B"]: p["ms"] for p in r["batched"] if p["S"] == w}
            cells = [f"{row[b]:.1f} ({row[b] / b:.1f})" for b in (1, *BATCHES)]
            md.append(f"| {r['role']} {r['precision']} | {w} | " + " | ".join(cells) + " |")
    qdq = [(p["qdq_ms"] / p["standard_ms"]) for r in results for p in r["batch1"] if "qdq_ms" in p]
    if qdq:
        md += [
            "",
            "int4 as DequantizeLinear + MatMul (ONNX Runtime fuses it into MatMulNBits) against MatMulNBits written "
            f"directly, standard graph, every batch-1 point: ratio median {statistics.median(qdq):.3f}, "
            f"min {min(qdq):.3f}, max {max(qdq):.3f}.",
        ]
    ratio, where = max(worst)
    verdict = "within" if ratio <= 1.05 else "NOT within"
    md += ["", f"Largest batch-1 ratio standard / gqa: {ratio:.3f} ({where}): {verdict} 5% on every point."]
    return "\n".join(md) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=kit.ROOT / "results/graph")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=None, help="role-precision pairs, e.g. target-int4")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pairs = [(r, p) for r in ("target", "draft") for p in ("int4", "fp32")]
    pairs = [x for x in pairs if args.only is None or f"{x[0]}-{x[1]}" in args.only]
    saved = args.out / "graph.json"
    results = {f"{r['role']}-{r['precision']}": r for r in (json.loads(saved.read_text()) if saved.exists() else [])}
    for role, precision in pairs:
        results[f"{role}-{precision}"] = measure(role, precision, args.reps)
        kit.write_json(saved, list(results.values()))
    kit.write_outputs(args.out, "graph", report(list(results.values()), kit.command_line()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
