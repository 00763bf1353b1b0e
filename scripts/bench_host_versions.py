#!/usr/bin/env python
"""Host time per round of this code against an older commit's, each on bundles its own exporter made.

    git archive 9f9ef70 | tar -x -C /tmp/old          # the code before the loop moved onto the device
    python scripts/make_tiny_pair.py /tmp/tiny        # HF checkpoints, then one bundle per code version:
    specrt export --model /tmp/tiny/tiny-target --role target --out /tmp/tiny/e-target --max-seq-len 512
    python scripts/bench_host_versions.py --old /tmp/old --export   # the old exporter writes /tmp/tiny/old-*
    python scripts/bench_host_versions.py --old /tmp/old --out results/host-versions-tiny

bench_host.py compares the paths of one code version in one process; an older commit cannot be imported
beside this one, so here each measurement is a child process running one version (the old one from its
source tree, never installed), alternated ABBA over `--turns`. Both are measured the same way whatever
their internals: time inside ONNX Runtime is what its sessions' run calls took (patched at the class, so
the old code needs no counter of its own), host time per round = (the engine thread's round time - that) /
rounds. B requests of `--tokens` new tokens run together with a fixed k, greedy and sampled (T 0.8, top-k 50).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import benchkit as kit

PROMPT = 'def merge_sort(items):\n    """Sort a list with merge sort and return a new list."""\n'


def use_tree(tree: str) -> None:
    """Import specrt (and its exporter, installed from export/) from `tree`, not from this checkout."""
    import importlib.util

    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, tree)
    spec = importlib.util.spec_from_file_location(
        "specrt.export", f"{tree}/export/__init__.py", submodule_search_locations=[f"{tree}/export"]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["specrt.export"] = module
    spec.loader.exec_module(module)


def child(tree: str, target: str, draft: str, mode: str, batch: int, k: int, tokens: int, reps: int) -> None:
    """One version's measurement, printed as a JSON line (runs in its own process)."""
    if tree != "this":
        use_tree(tree)
    import onnxruntime as ort

    inside = [0.0]
    for name in ("run_with_iobinding", "run"):
        real = getattr(ort.InferenceSession, name)

        def timed(self, *a, _real=real, **kw):
            t0 = time.perf_counter()
            try:
                return _real(self, *a, **kw)
            finally:
                inside[0] += time.perf_counter() - t0

        setattr(ort.InferenceSession, name, timed)
    import specrt

    if (tree == "this") != (Path(specrt.__file__).resolve().parent == kit.ROOT / "specrt"):
        raise SystemExit(f"imported the wrong specrt: {specrt.__file__}")
    engine = specrt.load(target, draft, max_batch=batch)
    step, spent = engine.scheduler.step, [0.0]

    def timed_step() -> None:
        t0 = time.perf_counter()
        step()
        spent[0] += time.perf_counter() - t0

    engine.scheduler.step = timed_step
    engine.complete(PROMPT, specrt.GenerationOptions(max_new_tokens=8, num_draft_tokens=2))  # warm: allocations
    options = specrt.GenerationOptions(
        max_new_tokens=tokens,
        num_draft_tokens=k,
        ignore_eos=True,
        temperature=0.8 if mode == "sampled" else 0.0,
        top_k=50 if mode == "sampled" else 0,
        seed=1,
    )
    host = []
    for _ in range(reps):
        rounds, s0, o0 = engine.stats["rounds"], spent[0], inside[0]
        threads = [threading.Thread(target=engine.complete, args=(PROMPT + f"# {i}\n", options)) for i in range(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        host.append(1000 * ((spent[0] - s0) - (inside[0] - o0)) / (engine.stats["rounds"] - rounds))
    print(json.dumps({"host_ms": host}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True, help="the older commit's source tree (git archive)")
    p.add_argument("--target", default="/tmp/tiny/e-target")
    p.add_argument("--draft", default="/tmp/tiny/e-draft")
    p.add_argument("--old-target", default="/tmp/tiny/old-target")
    p.add_argument("--old-draft", default="/tmp/tiny/old-draft")
    p.add_argument("--models", type=Path, default=Path("/tmp/tiny"), help="make_tiny_pair.py's folder (--export)")
    p.add_argument("--export", action="store_true", help="export the old bundles with the old exporter, then stop")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--reps", type=int, default=4, help="generations per process (the first is dropped: warm-up)")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--child", nargs=3, metavar=("TREE", "TARGET", "DRAFT"), help=argparse.SUPPRESS)
    p.add_argument("--mode", default="greedy", help=argparse.SUPPRESS)
    p.add_argument("--export-child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child, args.mode, args.batch, args.k, args.tokens, args.reps)
        return
    old = str(args.old.resolve())
    if args.export_child:  # the old exporter's command line, from the old tree
        use_tree(old)
        from specrt.cli import main as cli

        sys.argv = ["specrt", "export", *args.export_child]
        cli()
        return
    if args.export:
        for role, out in (("target", args.old_target), ("draft", args.old_draft)):
            flags = ["--model", str(args.models / f"tiny-{role}"), "--role", role, "--out", out, "--max-seq-len", "512"]
            subprocess.run([sys.executable, __file__, "--old", old, "--export-child", *flags], check=True)
        return
    versions = {"old": (old, args.old_target, args.old_draft), "this": ("this", args.target, args.draft)}
    got = {(v, m): [] for v in versions for m in ("greedy", "sampled")}
    for turn in range(args.turns):
        for mode in ("greedy", "sampled"):
            for v in kit.interleave(versions, turn):
                flags = ["--batch", str(args.batch), "--k", str(args.k), "--tokens", str(args.tokens)]
                flags += ["--reps", str(args.reps), "--mode", mode, "--old", old]
                line = (
                    subprocess.run(
                        [sys.executable, __file__, "--child", *versions[v], *flags],
                        check=True,
                        capture_output=True,
                        text=True,
                    )
                    .stdout.strip()
                    .splitlines()[-1]
                )
                got[v, mode] += json.loads(line)["host_ms"][1:]
                kit.log(f"turn {turn} {mode} {v}: {statistics.median(got[v, mode]):.2f} ms/round so far")
    lines = [
        f"`{kit.command_line()}`",
        "",
        f"batch {args.batch}, k {args.k}, {args.tokens} new tokens per request; "
        f"median of {args.turns} processes x {args.reps - 1} generations per version",
        "",
        "| mode | host ms/round old | host ms/round this | old / this |",
        "|---|---|---|---|",
    ]
    rows = []
    for mode in ("greedy", "sampled"):
        o, t = statistics.median(got["old", mode]), statistics.median(got["this", mode])
        rows.append(
            {"mode": mode, "old_ms": o, "this_ms": t, "old_runs": got["old", mode], "this_runs": got["this", mode]}
        )
        lines.append(f"| {mode} | {o:.2f} | {t:.2f} | {o / t:.2f}x |")
    md = "\n".join(lines) + "\n"
    kit.write_outputs(args.out, "host", md, {"command": kit.command_line(), "rows": rows})


if __name__ == "__main__":
    main()
