#!/usr/bin/env python
"""Where a batched round's time goes, plain batching against auto k: the engine's own bookkeeping (each row's
plan and cost model, the batch's ceiling, settling and learning) next to the graph runs.

    python results/trust/batch-bookkeeping/measure.py int4 8 0.7 4 [config ...]

(target, concurrency, temperature, parts, then bench_batch's configurations to compare: plain and auto unless
named.) Runs bench_batch's parts (same prompts, same warm-up), the configurations interleaved in one engine, and
times, per configuration, the scheduler's steps by stage through wrappers around its methods: `_plan` (every row's
drafter and k, CostModel.choose), `_batch_choice` (BatchCost.choose), `propose` (draft steps), `target_pass` (the
verify / plain pass and its sampling), `_settle` (rollback, counters, RequestCosts.observe), the batch cost's
`observe`, `_prefill` (a prompt chunk), and the rest of `_round` and `step` (admission, release). Rounds are also
split by how many rows ran (`round_alone`: one, a batch's tail or a lone request; `round_batched`: two or more),
with the tokens each kind made. Prints milliseconds per round by stage, the split, and tokens/s per part, and
writes <out>.json beside this file.
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
    "prefill": (scheduler.Scheduler, "_prefill"),
    "step": (scheduler.Scheduler, "step"),
}
SPLIT = ("round_alone", "round_batched")  # `_round` by its number of rows


def install(spent: dict[str, float], calls: dict[str, int]) -> None:
    """Wrap each stage's method at its class: its wall time accumulates in spent[stage] (nested stages count in
    their own stage and in the enclosing one)."""
    for stage, (cls, name) in STAGES.items():
        method = getattr(cls, name)

        def timed(*args, _method=method, _stage=stage, **kwargs):
            rows = args[1] if _stage == "round" else []
            before = sum(len(r.tokens) for r in rows)
            t0 = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[_stage] += time.perf_counter() - t0
                calls[_stage] += 1
                if rows:  # the split by rows, and the tokens the round committed
                    split = SPLIT[len(rows) > 1]
                    spent[split] += time.perf_counter() - t0
                    calls[split] += 1
                    calls[f"{split}_tokens"] += sum(len(r.tokens) for r in rows) - before
                if _stage == "propose":  # the draft's catch-up on tokens it sat out, inside propose
                    spent["catch_up"] += args[0].catch_up_ms / 1000
                    calls["catch_up_tokens"] += args[0].catch_up_tokens

        setattr(cls, name, timed)


def main() -> int:
    target, c, temperature, parts = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    names = sys.argv[5:] or ["plain", "auto"]
    import specrt

    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    install(spent, calls)
    engine = specrt.load(bb.BUNDLES[target], bb.BUNDLES["draft"], max_batch=c)
    bb.warm_up(engine, c)
    prompts = list(enumerate(kit.mixed_prompts(parts * c)))
    totals = {name: defaultdict(float) for name in names}
    counts = {name: defaultdict(int) for name in names}
    report: dict = {"command": " ".join(["python", *sys.argv]), "parts": []}
    for part in range(1, parts + 1):
        jobs = prompts[(part - 1) * c : part * c]
        row = {}
        for name in kit.interleave({n: bb.CONFIGS[n] for n in names}, c + part - 1):
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
            row[name] |= {s: {"rounds": calls[s], "s": spent[s], "tokens": calls[f"{s}_tokens"]} for s in SPLIT}
            row[name] |= {"prefill_s": spent["prefill"]}
            for s in [*STAGES, "catch_up", *SPLIT]:
                totals[name][s] += spent[s]
            for s in SPLIT:
                counts[name][s] += calls[s]
                counts[name][f"{s}_tokens"] += calls[f"{s}_tokens"]
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
            + f"; {names[-1]} / {names[0]} {row[names[-1]]['tokens_per_s'] / row[names[0]]['tokens_per_s']:.3f}",
            flush=True,
        )
    print("\nms per batched round, all parts (a stage nested in another counts in both):")
    print(f"{'stage':>15} " + " ".join(f"{n:>8}" for n in totals) + f"   {names[-1]} - {names[0]}")
    summary = {}
    for s in ["step", "round", "plan", "batch_choice", "propose", "catch_up", "target_pass", "settle", "batch_observe"]:
        per = {n: 1000 * totals[n][s] / max(counts[n]["rounds"], 1) for n in totals}
        summary[s] = per
        print(f"{s:>15} " + " ".join(f"{per[n]:8.2f}" for n in totals) + f"   {per[names[-1]] - per[names[0]]:+.2f}")
    print("\nseconds, rounds and tokens by kind, all parts:")
    for n in totals:
        split = {s: (totals[n][s], counts[n][s], counts[n][f"{s}_tokens"]) for s in SPLIT}
        summary[f"{n}_split"] = split | {"prefill_s": totals[n]["prefill"], "wall_s": totals[n]["wall"]}
        print(
            f"{n:>8}: prefill {totals[n]['prefill']:.2f} s; "
            + "; ".join(
                f"{s} {t:.2f} s, {r} rounds, {k} tokens ({k / t if t else 0:.1f} tok/s)"
                for s, (t, r, k) in split.items()
            )
            + f"; wall {totals[n]['wall']:.2f} s"
        )
    for n in totals:
        rate = counts[n]["tokens"] / totals[n]["wall"]
        print(f"{n}: {counts[n]['rounds']} rounds, {counts[n]['tokens']} tokens, {rate:.1f} tok/s over the parts")
        summary[n] = {"rounds": counts[n]["rounds"], "tokens": counts[n]["tokens"], "tokens_per_s": rate}
    report["summary"] = summary
    configs = "" if names == ["plain", "auto"] else "-" + "-".join(n.replace("=", "") for n in names)
    out = Path(__file__).with_name(f"{target}-c{c}-t{temperature:g}{configs}.json")
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
