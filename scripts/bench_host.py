#!/usr/bin/env python
"""Host time per round and bytes crossing per round: the sampler graphs (graph) against numpy (host).

    python scripts/bench_host.py --out results/host                          # the real int4 pair
    python scripts/bench_host.py --target T --draft D --out results/host-tiny --tokens 48
    python scripts/bench_host.py --numpy-target OLD_T --numpy-draft OLD_D --out results/host-before-after
                                 # numpy on bundles exported before (the mask sent per run) against the graphs


For each configuration (batch 1 / 4 / 8, k = 0 / 4, greedy / sampled at T = 0.8, top-k 50) and each path,
interleaved (ABBA over `--repeats`), B requests of `--tokens` new tokens run together with a fixed k. Host
time per round = (wall time - time inside ONNX Runtime, models and sampler graphs) / rounds; bytes per
round from the engine's transfer counter. One engine per path, both loaded for the whole run (the numpy
path may run other bundles: `--numpy-target/--numpy-draft`, e.g. ones whose runtime sends the mask). The wall
time is that of the engine's rounds (its scheduler's `step` calls, timed here), not of the clients' threads
turning ids into text.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import benchkit as kit

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
    args = p.parse_args()
    import specrt

    numpy_pair = (args.numpy_target or args.target, args.numpy_draft or args.draft)
    pairs = {"host": numpy_pair, "graph": (args.target, args.draft)}
    engines = {path: specrt.load(*pairs[path], max_batch=max(args.batches), sampler=path) for path in pairs}
    for e in engines.values():  # warm: first runs allocate
        timed_steps(e)
        e.complete(PROMPT, specrt.GenerationOptions(max_new_tokens=8, num_draft_tokens=2))
    rows = []
    for batch in args.batches:
        for k in (0, 4):
            for sampled in (False, True):
                got = {"host": [], "graph": []}
                for turn in range(2 * args.repeats):
                    for path in kit.interleave(["host", "graph"], turn):
                        got[path].append(one(engines[path], batch, k, sampled, args.tokens))
                row = {"batch": batch, "k": k, "mode": "sampled" if sampled else "greedy"}
                for path, runs in got.items():
                    for key in runs[0]:
                        row[f"{path}_{key}"] = statistics.median(r[key] for r in runs)
                row["host_time_ratio"] = row["host_host_ms_per_round"] / row["graph_host_ms_per_round"]
                row["speed_ratio"] = row["graph_tok_s"] / row["host_tok_s"]
                rows.append(row)
                kit.log(
                    f"batch {batch} k {k} {row['mode']}: host time {row['host_host_ms_per_round']:.2f} -> "
                    f"{row['graph_host_ms_per_round']:.2f} ms/round ({row['host_time_ratio']:.1f}x), to host "
                    f"{row['host_to_host_per_round']:.0f} -> {row['graph_to_host_per_round']:.0f} B/round, "
                    f"tok/s {row['host_tok_s']:.1f} -> {row['graph_tok_s']:.1f}"
                )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host.json").write_text(json.dumps({"command": kit.command_line(), "rows": rows}, indent=2))
    lines = [
        f"`{kit.command_line()}`",
        "",
        "| batch | k | mode | host ms/round numpy | graph | ratio | B to host/round numpy | graph | B to device/round "
        "numpy | graph | tok/s numpy | graph | speed graph/numpy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['k']} | {r['mode']} | {r['host_host_ms_per_round']:.2f} | "
            f"{r['graph_host_ms_per_round']:.2f} | {r['host_time_ratio']:.1f}x | {r['host_to_host_per_round']:,.0f} | "
            f"{r['graph_to_host_per_round']:,.0f} | {r['host_to_device_per_round']:,.0f} | "
            f"{r['graph_to_device_per_round']:,.0f} | {r['host_tok_s']:.1f} | {r['graph_tok_s']:.1f} | "
            f"{r['speed_ratio']:.2f} |"
        )
    (args.out / "host.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
