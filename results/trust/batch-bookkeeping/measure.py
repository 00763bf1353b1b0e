#!/usr/bin/env python
"""Where a batched round's time goes, plain batching against auto k: the engine's own bookkeeping (each row's
plan and cost model, the batch's ceiling, settling and learning) next to the graph runs.

    python results/trust/batch-bookkeeping/measure.py int4 8 0.7 4

(target, concurrency, temperature, parts.) Runs bench_batch's parts (same prompts, same warm-up), plain and auto
interleaved in one engine, and times, per configuration, the scheduler's steps by stage through wrappers around
its methods: `_plan` (every row's drafter and k, CostModel.choose), `_batch_choice` (BatchCost.choose),
`propose` (draft steps), `target_pass` (the verify / plain pass and its sampling), `_settle` (rollback, counters,
RequestCosts.observe), the batch cost's `observe`, and the rest of `_round` and `step` (admission, prefill,
release). Prints milliseconds per batched round by stage and tokens/s per part, and writes <out>.json beside
this file.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_batch as bb  # noqa: E402
import benchkit as kit  # noqa: E402

from specrt.engine import runner, scheduler  # noqa: E402
from specrt.tuning import batchcost  # noqa: E402

STAGES = {
    "plan": (scheduler.Scheduler, "_plan"),
    "batch_choice": (scheduler.Scheduler, "_batch_choice"),
    "propose": (runner.Runner, "propose"),
    "target_pass": (runner.Runner, "target_pass"),
    "settle": (scheduler.Scheduler, "_settle"),
    "batch_observe": (batchcost.BatchCost, "observe"),
    "round": (scheduler.Scheduler, "_round"),
    "step": (scheduler.Scheduler, "step"),
}


def install(spent: dict[str, float], calls: dict[str, int]) -> None:
    """Wrap each stage's method at its class: its wall time accumulates in spent[stage] (nested stages count in
    their own stage and in the enclosing one)."""
    for stage, (cls, name) in STAGES.items():
        method = getattr(cls, name)

        def timed(*args, _method=method, _stage=stage, **kwargs):
            t0 = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[_stage] += time.perf_counter() - t0
                calls[_stage] += 1
                if _stage == "propose":  # the draft's catch-up on tokens it sat out, inside propose
                    spent["catch_up"] += args[0].catch_up_ms / 1000
                    calls["catch_up_tokens"] += args[0].catch_up_tokens

        setattr(cls, name, timed)


def main() -> int:
    target, c, temperature, parts = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    import specrt

    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    install(spent, calls)
    engine = specrt.load(bb.BUNDLES[target], bb.BUNDLES["draft"], max_batch=c)
    bb.warm_up(engine, c)
    prompts = list(enumerate(kit.mixed_prompts(parts * c)))
    totals = {name: defaultdict(float) for name in ("plain", "auto")}
    counts = {name: defaultdict(int) for name in ("plain", "auto")}
    report: dict = {"command": " ".join(["python", *sys.argv]), "parts": []}
    for part in range(1, parts + 1):
        jobs = prompts[(part - 1) * c : part * c]
        row = {}
        for name in kit.interleave({n: bb.CONFIGS[n] for n in ("plain", "auto")}, c + part - 1):
            engine.reset()
            spent.clear()
            calls.clear()
            got = bb.run_specrt(engine, c, bb.CONFIGS[name], temperature, jobs)
            tokens = sum(r["tokens"] for r in got["results"])
            rounds = calls["round"]
            row[name] = {"tokens_per_s": tokens / got["wall"], "rounds": rounds, "wall_s": got["wall"]}
            row[name] |= {"k_chosen": {k: v for k, v in got["k_chosen"].items() if v}}
            row[name] |= {"catch_up_tokens": calls["catch_up_tokens"], "catch_up_s": spent["catch_up"]}
            row[name] |= {f"{s}_ms_per_round": 1000 * spent[s] / max(rounds, 1) for s in STAGES}
            for s in [*STAGES, "catch_up"]:
                totals[name][s] += spent[s]
            counts[name]["rounds"] += rounds
            counts[name]["tokens"] += tokens
            totals[name]["wall"] += got["wall"]
        report["parts"].append(row)
        print(
            f"part {part}: "
            + ", ".join(
                f"{n} {v['tokens_per_s']:.1f} tok/s ({v['rounds']} rounds, k {v['k_chosen']}, draft catch-up"
                f" {v['catch_up_tokens']} tokens in {v['catch_up_s']:.2f} s)"
                for n, v in row.items()
            )
            + f"; auto / plain {row['auto']['tokens_per_s'] / row['plain']['tokens_per_s']:.3f}",
            flush=True,
        )
    print("\nms per batched round, all parts (a stage nested in another counts in both):")
    print(f"{'stage':>15} " + " ".join(f"{n:>8}" for n in totals) + "   auto - plain")
    summary = {}
    for s in ["step", "round", "plan", "batch_choice", "propose", "catch_up", "target_pass", "settle", "batch_observe"]:
        per = {n: 1000 * totals[n][s] / max(counts[n]["rounds"], 1) for n in totals}
        summary[s] = per
        print(f"{s:>15} " + " ".join(f"{per[n]:8.2f}" for n in totals) + f"   {per['auto'] - per['plain']:+.2f}")
    for n in totals:
        rate = counts[n]["tokens"] / totals[n]["wall"]
        print(f"{n}: {counts[n]['rounds']} rounds, {counts[n]['tokens']} tokens, {rate:.1f} tok/s over the parts")
        summary[n] = {"rounds": counts[n]["rounds"], "tokens": counts[n]["tokens"], "tokens_per_s": rate}
    report["summary"] = summary
    out = Path(__file__).with_name(f"{target}-c{c}-t{temperature:g}.json")
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
