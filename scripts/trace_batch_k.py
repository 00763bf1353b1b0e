#!/usr/bin/env python
"""Why auto k chose what it chose in a batch: the batch's ceiling (BatchCost) and the rows' own k, round by round.

    python scripts/trace_batch_k.py --target int4 --concurrency 2 --parts 1,3,4 --out results/trace

Runs bench_batch's own parts (same prompts, same warm-up, the configurations interleaved in each part, greedy by
default) and records every batched round auto k ran: the k each row wanted, the choice (ceiling in force,
per-row k, probe / explore / starved), the predicted time of a plain round and of the chosen one (the batch
model's `round_ms`, with the learned width ratios as they were), the expected tokens per row at k = 0..3, the
catch-ups charged, then what ran: the drafts, the accepted ones and the measured milliseconds. Writes
<out>/trace-<target>-c<c>.jsonl, and each row's own choices (CostModel.choose: k, why, E(k), alone or in a
batch) and early stops to <out>/rows-<target>-c<c>.jsonl, and prints a summary per kind of round (measured and
predicted ms per pass width, tokens per round) and each configuration's tokens/s per part (`--configs`: plain
and auto by default), with auto's ratio to the best of the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import bench_batch as bb
import benchkit as kit

from specrt.tuning import batchcost, costmodel

# bench_batch's targets, and the native one (GGUF Q4_K_M through the exporter's own graph) of the serve suite
TARGETS = {**bb.BUNDLES, "native": kit.ROOT / "engines/qwen2.5-coder-1.5b-native"}
del TARGETS["draft"]


def install_trace(log: list[dict]) -> None:
    """Wrap BatchCost.choose / observe (at the class: the engine replaces its BatchCost when it measures)."""
    choose, observe = batchcost.BatchCost.choose, batchcost.BatchCost.observe
    traced: dict[int, dict] = {}  # id of the choice last logged -> its entry (the scheduler observes it next)

    def traced_choose(
        self, wanted, expected, fixed, drafting, context=None, catch_up=None, left=None, room=None, span=None
    ):
        choice = choose(self, wanted, expected, fixed, drafting, context, catch_up, left, room, span)
        if all(fixed):
            return choice
        n = len(wanted)
        traced.clear()
        traced[id(choice)] = entry = {
            "rows": n,
            "context": context,
            "wanted": list(wanted),
            "room": list(room or []),
            "expected": [[round(e(k), 3) for k in range(4)] for e in expected],
            "catch_up": [round(c, 1) for c in (catch_up or [])],
            "ceiling_before": self.ceiling,
            "ceiling": choice.ceiling,
            "ks": list(choice.ks),
            "kind": "probe" if choice.probed else "explore" if choice.explore else "choice",
            "starved": choice.starved,
            "span": span,
            "plain_ms": round(self.round_ms([0] * n, drafting, context, span), 1),
            "chosen_ms": round(self.round_ms(choice.ks, drafting, context, span), 1),
            "ratios": {f"{b}x{w}": round(r, 3) for (b, w), r in sorted(self.ratios.items())},
            "wait": self.wait,
        }
        log.append(entry)
        return choice

    def traced_observe(self, choice, drafted=(), drafting=None, context=None, measured_ms=0.0, accepted=(), span=None):
        if (entry := traced.pop(id(choice), None)) is not None:
            entry |= {"drafted": list(drafted), "accepted": list(accepted), "measured_ms": round(measured_ms, 1)}
        return observe(self, choice, drafted, drafting, context, measured_ms, accepted, span)

    batchcost.BatchCost.choose, batchcost.BatchCost.observe = traced_choose, traced_observe


def install_row_trace(log: list[dict]) -> None:
    """Wrap CostModel.choose / keep_drafting: each row's own k (as if alone, or in a batch before its ceiling)
    and where its draft stopped early."""
    choose, keep = costmodel.CostModel.choose, costmodel.CostModel.keep_drafting

    def traced_choose(self, k_cap, context, alone=True, missed=0, remaining=None):
        choice = choose(self, k_cap, context, alone, missed, remaining)
        expected = [round(self.acceptance.expected_tokens(k), 3) for k in range(min(k_cap, 8) + 1)]
        log.append(
            {"row": id(self) % 10**6, "alone": alone, "context": context, "cap": k_cap, "k": choice.k}
            | {"why": choice.why, "expected": expected}
        )
        return choice

    def traced_keep(self, confidences, k, context):
        going = keep(self, confidences, k, context)
        if not going and len(confidences) < k:
            log.append({"row": id(self) % 10**6, "stop": len(confidences), "of": k, "context": context})
        return going

    costmodel.CostModel.choose, costmodel.CostModel.keep_drafting = traced_choose, traced_keep


def summarise_rows(entries: list[dict]) -> list[str]:
    """The rows' own choices, alone and in a batch, and their early stops."""
    lines = []
    for alone in (True, False):
        chosen = [e for e in entries if e.get("alone") is alone]
        if chosen:
            ks: dict[str, int] = defaultdict(int)
            for e in chosen:
                ks[f"{e['k']} {e['why']}"] += 1
            lines.append(f"rows' own k ({'alone' if alone else 'in a batch'}): {dict(sorted(ks.items()))}")
    stops: dict[str, int] = defaultdict(int)
    for e in entries:
        if "stop" in e:
            stops[f"{e['stop']}/{e['of']}"] += 1
    if stops:
        lines.append(f"early stops (drafted / chosen): {dict(sorted(stops.items()))}")
    return lines


def summarise(rounds: list[dict]) -> list[str]:
    lines = []
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for r in rounds:
        if "measured_ms" in r:
            by_kind[r["kind"] + ("/drafting" if any(r["drafted"]) else "/plain")].append(r)
    for kind, rs in sorted(by_kind.items()):
        tokens = sum(sum(a) + len(a) for a in (r["accepted"] for r in rs))
        lines.append(f"{kind}: {len(rs)} rounds, {tokens / len(rs):.2f} tokens/round")
        widths: dict[int, list[dict]] = defaultdict(list)
        for r in rs:
            widths[max(r["drafted"]) + 1].append(r)
        for w, ws in sorted(widths.items()):
            measured = statistics.median(r["measured_ms"] for r in ws)
            predicted = statistics.median(r["chosen_ms"] for r in ws)
            plain = statistics.median(r["plain_ms"] for r in ws)
            made = statistics.mean(sum(r["accepted"]) + len(r["accepted"]) for r in ws)
            lines.append(
                f"  width {w}: {len(ws)} rounds, measured {measured:.1f} ms, predicted {predicted:.1f} "
                f"(plain predicted {plain:.1f}), tokens/round {made:.2f}"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="int4", choices=sorted(TARGETS))
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--parts", default="1,2,3,4", help="bench_batch's parts to run (1-based, comma-separated)")
    parser.add_argument("--bench-parts", type=int, default=4, help="bench_batch's --parts (sets the prompts)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--configs", nargs="+", default=["plain", "auto"], choices=list(bb.CONFIGS), help="run in every part"
    )
    parser.add_argument("--out", type=Path, default=Path("results/trace"))
    args = parser.parse_args()

    import specrt

    rounds: list[dict] = []
    row_log: list[dict] = []
    install_trace(rounds)
    install_row_trace(row_log)
    c = args.concurrency
    engine = specrt.load(TARGETS[args.target], bb.BUNDLES["draft"], max_batch=c)
    bb.warm_up(engine, c)
    prompts = list(enumerate(kit.mixed_prompts(args.bench_parts * c)))
    rounds.clear()
    row_log.clear()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"trace-{args.target}-c{c}.jsonl"
    row_path = args.out / f"rows-{args.target}-c{c}.jsonl"
    with path.open("w") as f, row_path.open("w") as g:
        for part in (int(p) for p in args.parts.split(",")):
            jobs = prompts[(part - 1) * c : part * c]
            speeds = {}
            for name in kit.interleave({name: bb.CONFIGS[name] for name in args.configs}, c + part - 1):
                engine.reset()
                start, row_start = len(rounds), len(row_log)
                got = bb.run_specrt(engine, c, bb.CONFIGS[name], args.temperature, jobs)
                speeds[name] = sum(r["tokens"] for r in got["results"]) / got["wall"]
                for r in rounds[start:]:
                    f.write(json.dumps({"part": part, "config": name} | r) + "\n")
                for e in row_log[row_start:]:
                    g.write(json.dumps({"part": part, "config": name} | e) + "\n")
                if name == "auto":
                    print(f"part {part} auto k {dict(sorted((k, v) for k, v in got['k_chosen'].items() if v))}")
                    print("\n".join(summarise(rounds[start:]) + summarise_rows(row_log[row_start:])))
            best = max((v for name, v in speeds.items() if name != "auto"), default=0.0)
            ratio = f" (auto / best of the others {speeds['auto'] / best:.3f})" if "auto" in speeds and best else ""
            print(f"part {part}: " + ", ".join(f"{name} {v:.1f} tok/s" for name, v in speeds.items()) + ratio)
    print(f"wrote {path} and {row_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
