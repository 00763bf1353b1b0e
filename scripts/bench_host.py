#!/usr/bin/env python
"""Host time per round and bytes crossing per round: decisions on the device (graph) against numpy (host).

    python scripts/bench_host.py --out results/host                          # the real int4 pair
    python scripts/bench_host.py --paths host sampler graph --modes greedy --out results/host-top
                                 # also the graph path with greedy picks in sampler graphs (before `top`)
    python scripts/bench_host.py --paths host unchained graph --modes greedy --out results/host-chain
                                 # greedy draft steps chained on the device against built from the host
    python scripts/bench_host.py --target T --draft D --out results/host-tiny --tokens 48
    python scripts/bench_host.py --numpy-target OLD_T --numpy-draft OLD_D --out results/host-before-after
                                 # numpy on bundles exported before (the mask sent per run) against the graphs


Paths: "host" (numpy: logits read back), "graph" (greedy rounds read ids computed in the model runs, other
rounds run the sampler graphs), "sampler" (the graph path with every decision in the sampler graphs, as for
bundles exported before the model graph computed its greedy pick), "unchained" (the graph path with every
draft step's inputs built and bound from the host, as before draft steps chained on the device).
For each configuration (batch 1 / 4 / 8, k = 0 / 4, greedy / sampled at T = 0.8, top-k 50) and each path,
interleaved (ABBA over `--repeats`), B requests of `--tokens` new tokens run together with a fixed k. Host
time per round = (wall time - time inside ONNX Runtime, models and sampler graphs) / rounds; bytes per round
from the engine's transfer counter. One engine per path, all loaded for the whole run (the numpy path may
run other bundles: `--numpy-target/--numpy-draft`, e.g. ones whose runtime sends the mask). The wall time is that of the
engine's rounds (its scheduler's `step` calls, timed here), not of the clients' threads turning ids into
text.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import benchkit as kit

PATHS = {"host": "host", "graph": "graph", "sampler": "graph", "unchained": "graph"}  # path -> specrt.load's sampler
LABELS = {"host": "numpy", "graph": "graph", "sampler": "sampler graphs", "unchained": "graph unchained"}
PROMPT = 'def merge_sort(items):\n    """Sort a list with merge sort and return a new list."""\n'


def ort_seconds(engine) -> float:
    total = engine.target.seconds + (engine.draft.seconds if engine.draft else 0.0)
    sampler = getattr(engine.decider, "sampler", None)
    return total + (sampler.seconds if sampler else 0.0)


def timed_steps(engine) -> None:
    """Count the seconds the engine's thread spends in scheduler rounds (the loop, ONNX Runtime included)."""
    step = engine.scheduler.step
    engine.step_s = 0.0

    def timed() -> None:
        t0 = time.perf_counter()
        step()
        engine.step_s += time.perf_counter() - t0

    engine.scheduler.step = timed


def one(engine, batch: int, k: int, sampled: bool, tokens: int) -> dict:
    import specrt

    options = specrt.GenerationOptions(
        max_new_tokens=tokens,
        num_draft_tokens=k,
        ignore_eos=True,
        temperature=0.8 if sampled else 0.0,
        top_k=50 if sampled else 0,
        seed=1,
    )
    prompts = [PROMPT + f"# variant {i}\n" for i in range(batch)]
    before = dict(engine.stats)
    ort0, step0, t0 = ort_seconds(engine), engine.step_s, time.perf_counter()
    threads = [threading.Thread(target=engine.complete, args=(p, options)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, ort, steps = time.perf_counter() - t0, ort_seconds(engine) - ort0, engine.step_s - step0
    after = engine.stats
    rounds = after["rounds"] - before["rounds"]
    return {
        "host_ms_per_round": 1000 * (steps - ort) / rounds,
        "to_host_per_round": (after["bytes_to_host"] - before["bytes_to_host"]) / rounds,
        "to_device_per_round": (after["bytes_to_device"] - before["bytes_to_device"]) / rounds,
        "tok_s": batch * tokens / wall,
        "rounds": rounds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, default=kit.ROOT / "engines/qwen2.5-coder-1.5b-int4")
    p.add_argument("--draft", type=Path, default=kit.ROOT / "engines/qwen2.5-coder-0.5b-int4")
    p.add_argument("--numpy-target", type=Path, default=None, help="the numpy path's target [default: --target]")
    p.add_argument("--numpy-draft", type=Path, default=None, help="the numpy path's draft [default: --draft]")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--paths", nargs="+", choices=PATHS, default=["host", "graph"], help="the first is the baseline")
    p.add_argument("--modes", nargs="+", choices=["greedy", "sampled"], default=["greedy", "sampled"])
    p.add_argument("--ks", type=int, nargs="+", default=[0, 4])
    args = p.parse_args()
    import specrt

    numpy_pair = (args.numpy_target or args.target, args.numpy_draft or args.draft)
    paths = args.paths
    engines = {}
    for path in paths:
        pair = numpy_pair if path == "host" else (args.target, args.draft)
        engines[path] = e = specrt.load(*pair, max_batch=max(args.batches), sampler=PATHS[path])
        if path == "sampler":  # no greedy pick from the model runs: every decision in a sampler graph
            e.decider.top = lambda rows, draft: 0
        if path == "unchained" and e.draft is not None:  # every draft step built and bound from the host
            e.draft.chain = lambda lo, hi: None
        timed_steps(e)
        e.complete(PROMPT, specrt.GenerationOptions(max_new_tokens=8, num_draft_tokens=2))  # warm: allocations
    rows = []
    for batch in args.batches:
        for k in args.ks:
            for mode in args.modes:
                got = {path: [] for path in paths}
                for turn in range(2 * args.repeats):
                    for path in kit.interleave(paths, turn):
                        got[path].append(one(engines[path], batch, k, mode == "sampled", args.tokens))
                row = {"batch": batch, "k": k, "mode": mode}
                for path, runs in got.items():
                    for key in runs[0]:
                        row[f"{path}_{key}"] = statistics.median(r[key] for r in runs)
                rows.append(row)
                kit.log(
                    f"batch {batch} k {k} {mode}: host ms/round "
                    + ", ".join(f"{path} {row[f'{path}_host_ms_per_round']:.2f}" for path in paths)
                    + "; B to host/round "
                    + ", ".join(f"{path} {row[f'{path}_to_host_per_round']:.0f}" for path in paths)
                    + "; tok/s "
                    + ", ".join(f"{path} {row[f'{path}_tok_s']:.1f}" for path in paths)
                )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host.json").write_text(json.dumps({"command": kit.command_line(), "rows": rows}, indent=2))
    (args.out / "host.md").write_text(table(rows, paths))
    print(table(rows, paths))


def table(rows: list[dict], paths: list[str]) -> str:
    """Per configuration: host ms/round, bytes each way and tok/s per path, and each path against the first."""
    base, others = paths[0], paths[1:]
    name = {p: LABELS[p] for p in paths}
    head = ["batch", "k", "mode"]
    head += [f"host ms/round {name[p]}" for p in paths] + [f"{name[base]} / {name[p]}" for p in others]
    head += [f"B to host/round {name[p]}" for p in paths] + [f"B to device/round {name[p]}" for p in paths]
    head += [f"tok/s {name[p]}" for p in paths] + [f"speed {name[p]} / {name[base]}" for p in others]
    lines = [f"`{kit.command_line()}`", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["batch"]), str(r["k"]), r["mode"]]
        ms = {p: r[f"{p}_host_ms_per_round"] for p in paths}
        cells += [f"{ms[p]:.2f}" for p in paths] + [f"{ms[base] / ms[p]:.1f}x" for p in others]
        cells += [f"{r[f'{p}_to_host_per_round']:,.0f}" for p in paths]
        cells += [f"{r[f'{p}_to_device_per_round']:,.0f}" for p in paths]
        cells += [f"{r[f'{p}_tok_s']:.1f}" for p in paths]
        cells += [f"{r[f'{p}_tok_s'] / r[f'{base}_tok_s']:.2f}" for p in others]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
