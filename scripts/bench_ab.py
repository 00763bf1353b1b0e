#!/usr/bin/env python
"""A/B benchmark: several engine configurations on the same prompts, interleaved, in one run.

Each configuration is a worker process holding one loaded engine: a specrt source tree (`--config NAME=ROOT`,
e.g. a worktree of an older commit, to check that a change keeps the speed) and, for trees that have it, a
tuning policy override (`NAME=ROOT:plain_every=None,early_stop=False` switches a heuristic of
specrt.tuning.costmodel.Policy off; `batch_plain_margin=-1` sets a field of the batch's cost model,
specrt.tuning.batchcost.BatchCost), a fixed k (`k=3`; auto otherwise), and stored profiles as an export on a
busy machine leaves them (`target_profile_x=5,draft_profile_x=11`: the worker loads hard-linked copies of the
bundles whose stored profiles are that many times too slow, scripts/busy_bundles.py; the copies live in a
temporary folder, so what the engine stores after measuring again never touches the originals). The parent
sends every worker the same generation in turn, prompt by prompt and repeat by repeat, the order of the
workers reversed every other time, so drift on a noisy machine hits every configuration alike; idle workers do
not spin (a draft is loaded, so threads stop between runs). It reports tokens/s per prompt (median of repeats,
end to end, caches cleared before each run) and each configuration's ratio to the first one, per prompt and
overall (median of the per-repeat ratios), and whether greedy outputs were equal.

    python scripts/bench_ab.py --target engines/qwen2.5-coder-1.5b-int4 --draft engines/qwen2.5-coder-0.5b-int4 \\
        --config old=/tmp/specrt-old --config new=. --repeats 3 --out results/layout/int4.json

`--concurrency c` makes each generation c requests at once (the prompt and the c - 1 after it in the list,
from c threads, `max_batch` = c); tokens/s is then all of their new tokens over the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import benchkit as kit

ROOT = kit.ROOT


def worker(args: argparse.Namespace) -> None:
    import specrt

    try:
        from specrt.prompts import DEFAULT_PROMPTS
    except ImportError:  # a source tree from before specrt/prompts.py
        from specrt.bench import DEFAULT_PROMPTS

    policy = json.loads(args.policy) if args.policy else {}
    fixed_k = policy.pop("k", None)
    batch_policy = {key[len("batch_") :]: policy.pop(key) for key in list(policy) if key.startswith("batch_")}
    factors = {role: policy.pop(f"{role}_profile_x", None) for role in ("target", "draft")}
    bundles = {"target": args.target, "draft": args.draft}
    if any(factors.values()):
        import tempfile

        from busy_bundles import scaled_copy

        tmp = Path(tempfile.mkdtemp(prefix="specrt-busy-"))
        bundles = {role: scaled_copy(bundles[role], factors[role] or 1.0, tmp / role) for role in bundles}
    batch = {"max_batch": args.concurrency} if args.concurrency > 1 else {}  # trees from before batching lack it
    engine = specrt.load(bundles["target"], bundles["draft"], threads=args.threads, **batch)
    if policy:
        from dataclasses import replace

        engine.tuning.policy = replace(engine.tuning.policy, **policy)
    if batch_policy:  # fields of the batch's cost model (specrt.tuning.batchcost.BatchCost), set when it is made
        make = engine._batch_cost

        def batch_cost(*args, **kwargs):  # (its arguments and result have changed over the trees' history)
            made = make(*args, **kwargs)
            cost = made[0] if isinstance(made, tuple) else made  # today: (the batch's cost, the row profiles)
            for key, value in batch_policy.items() if cost is not None else ():
                setattr(cost, key, value)
            return made

        engine._batch_cost = batch_cost
    prompts = {p.name: p for p in DEFAULT_PROMPTS}
    names = [p.name for p in DEFAULT_PROMPTS]
    # Warm-up: the first generation of a fresh engine pages in weights and sizes buffers (and measures profiles).
    engine.complete("def warm_up():", specrt.GenerationOptions(max_new_tokens=16, ignore_eos=True))
    print(json.dumps({"ready": specrt.__file__}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        options = specrt.GenerationOptions(
            max_new_tokens=job["max_new_tokens"],
            temperature=job["temperature"],
            seed=0,
            ignore_eos=True,
            num_draft_tokens=fixed_k,
        )
        engine.reset()
        # The job's prompt and, at concurrency c, the c - 1 after it in the list, together from c threads.
        start = names.index(job["prompt"])
        batch = [prompts[names[(start + i) % len(names)]] for i in range(args.concurrency)]
        ids = [engine.encode(p.text, chat=p.chat) for p in batch]
        gens, wall = run_together(engine, ids, options)
        stats = [g.stats for g in gens]
        drafted = sum(s.drafted for s in stats)
        k: dict[str, int] = {}
        for s in stats:
            for n, count in s.k_histogram.items():
                k[str(n)] = k.get(str(n), 0) + count
        out = {
            "tok_s": sum(s.new_tokens for s in stats) / wall
            if len(batch) > 1
            else stats[0].new_tokens / stats[0].total_s,
            "tokens": [t for g in gens for t in g.token_ids],
            "acceptance": sum(s.accepted for s in stats) / drafted if drafted else 0.0,
            "k": dict(sorted(k.items(), key=lambda x: int(x[0]))),
        }
        cost = getattr(engine.scheduler, "batch_cost", None)
        if cost is not None:  # what the batch has learned so far: live / profiled round time per pass width
            out["batch_ratios"] = {str(w): round(r, 3) for w, r in sorted(cost.ratios.items())}
        print(json.dumps(out), flush=True)


def run_together(engine, prompts: list, options) -> tuple[list, float]:
    """Every prompt at once, one client thread each: (their generations, the wall time of all of them)."""
    gens: list = [None] * len(prompts)

    def one(i: int) -> None:
        gens[i] = engine.complete(prompts[i], options)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return gens, time.perf_counter() - t0


def _value(text: str):
    words = {"True": True, "False": False, "None": None}
    if text in words:
        return words[text]
    return float(text) if "." in text else int(text)


def parse_config(text: str) -> tuple[str, str, dict]:
    """NAME=ROOT[:key=value,...] -> (name, absolute root, policy overrides)."""
    name, _, rest = text.partition("=")
    root, _, overrides = rest.partition(":")
    policy = {k: _value(v) for k, _, v in (item.partition("=") for item in overrides.split(",") if item)}
    return name, str(Path(root).resolve()), policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--config", action="append", default=[], help="NAME=ROOT[:key=value,...] (repeatable)")
    ap.add_argument("--prompts", nargs="*", default=None, help="Prompt names (default: all eight).")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument(
        "--concurrency", type=int, default=1, help="requests per generation, together (the prompt and the next c - 1)"
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--policy", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    configs = [parse_config(c) for c in args.config] or [("current", str(ROOT), {})]
    sys.path.insert(0, str(ROOT))
    from specrt.prompts import DEFAULT_PROMPTS

    names = args.prompts or [p.name for p in DEFAULT_PROMPTS]
    workers = {}
    for name, root, policy in configs:
        cmd = [sys.executable, __file__, "--worker", "--target", args.target, "--draft", args.draft]
        cmd += ["--threads", str(args.threads), "--concurrency", str(args.concurrency)]
        cmd += ["--policy", json.dumps(policy) if policy else ""]
        env = {**os.environ, "PYTHONPATH": root}
        workers[name] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    for name, w in workers.items():  # loaded one after the other (each measures its profiles alone)
        print(f"{name}: {json.loads(w.stdout.readline())['ready']}", file=sys.stderr)
    runs: dict[str, dict[str, list[dict]]] = {n: {p: [] for p in names} for n in workers}
    order = list(workers)
    t0 = time.time()
    for rep in range(args.repeats):
        for i, prompt in enumerate(names):
            for name in kit.interleave(order, rep + i):
                w = workers[name]
                job = {"prompt": prompt, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
                w.stdin.write(json.dumps(job) + "\n")
                w.stdin.flush()
                runs[name][prompt].append(json.loads(w.stdout.readline()))
            line = "  ".join(f"{n} {runs[n][prompt][-1]['tok_s']:6.2f}" for n in order)
            print(f"[{time.time() - t0:6.0f} s] rep {rep + 1} {prompt:<20} {line}", file=sys.stderr)
    for w in workers.values():
        w.stdin.close()
        w.wait(timeout=60)
    base = order[0]
    report = {
        "target": args.target,
        "draft": args.draft,
        "configs": {n: {"root": r, "policy": p} for n, r, p in configs},
    }
    report["prompts"] = {}
    lines = [
        "| prompt | "
        + " | ".join(f"{n} tok/s" for n in order)
        + " | "
        + " | ".join(f"{n}/{base}" for n in order[1:])
        + " | distinct greedy outputs |"
    ]
    lines.append("|---" * (2 * len(order) + 1) + "|")
    overall = {n: [] for n in order[1:]}
    for prompt in names:
        med = {n: statistics.median(r["tok_s"] for r in runs[n][prompt]) for n in order}
        ratios = {}
        for n in order[1:]:
            paired = [a["tok_s"] / b["tok_s"] for a, b in zip(runs[n][prompt], runs[base][prompt], strict=True)]
            ratios[n] = statistics.median(paired)
            overall[n] += paired
        first = runs[base][prompt][0]["tokens"]
        equal = {n: all(r["tokens"] == first for r in runs[n][prompt]) for n in order}
        # Distinct greedy outputs among a configuration's own repeats (auto k's choices follow live timings,
        # and a quantized target's verify passes may round a near-tie differently at different widths).
        distinct = {n: len({tuple(r["tokens"]) for r in runs[n][prompt]}) for n in order}
        report["prompts"][prompt] = {
            "tok_s": med,
            "ratio": ratios,
            "equal_to_first": equal,
            "distinct_outputs": distinct,
            "runs": {n: [{k: v for k, v in r.items() if k != "tokens"} for r in runs[n][prompt]] for n in order},
        }
        lines.append(
            f"| {prompt} | "
            + " | ".join(f"{med[n]:.2f}" for n in order)
            + " | "
            + " | ".join(f"{ratios[n]:.3f}" for n in order[1:])
            + f" | {len({tuple(r['tokens']) for n in order for r in runs[n][prompt]})} "
            + "("
            + ", ".join(f"{n} {distinct[n]}" for n in order)
            + ") |"
        )
    report["overall_median_ratio"] = {n: statistics.median(v) for n, v in overall.items()}
    lines.append(
        "| **median of all paired ratios** | "
        + " | " * (len(order) - 1)
        + " | "
        + " | ".join(f"**{report['overall_median_ratio'][n]:.3f}**" for n in order[1:])
        + " | |"
    )
    report["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        args.out.with_suffix(".md").write_text("\n".join([f"`{report['command']}`", "", *lines]) + "\n")


if __name__ == "__main__":
    main()
