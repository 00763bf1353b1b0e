#!/usr/bin/env python
"""Many requests at once: the batch engine against itself with speculation off and at fixed k, and against
llama.cpp's llama-server, at concurrency 1, 2, 4, 8 (16 with --max-concurrency 16), on the real pair.

    python scripts/bench_batch.py --out results/batch                  # about two hours on 2 cores
    python scripts/bench_batch.py --targets int4 --concurrency 1 4      # a part of it

Every request has a different prompt (code, prose and chat, in turn) and asks for 128 new tokens, EOS
ignored; each concurrency level runs `--parts` parts (2 by default) of c requests from c client threads (each
thread sends its next request when its last one ends), greedy and at temperature 0.7 (seeded).
Configurations, each with max_batch = c: plain batching (k = 0), fixed k = 3 and 5, and auto k, for the fp32
and the int4 target (standard graph, int4 draft). The configurations are interleaved: every part runs each of
them on the same c prompts, in an order reversed from one part to the next (ABBA), so that this machine's
drift (up to 2x within minutes) hits them alike, and each from an empty cache (`engine.reset()`): every one
prefills its prompts, as a server does for new ones (the engine keeps a finished request's context for a
follow-up, so the configurations after the first of a part found their prompts cached and skipped ~10% of
the part's time: int4, 2 rows, 0.6 s of a 6 s part); auto's cell is judged by the median over parts of
auto's tokens/s over the best fixed configuration's in the same part. Reported per cell: total output tokens/s
(all tokens over the summed wall time of the parts), per-request tokens/s (median), time to first token
p50 / p99, the k chosen per round and the batch sizes seen, and the process's peak RSS. llama-server (built
by scripts/build_llamacpp.sh) runs the same requests on the GGUF pair with -np c, plain and with
--model-draft (draft-simple, k = 5), when built.
OpenVINO GenAI's ContinuousBatchingPipeline (scripts/peer_openvino.py, its own venv, prepared when needed)
runs them too, on the GGUF target and on its int4 IR of it (--openvino-targets), plain and with its int4 IR
draft (k = 3), at most c requests in flight (about 10 minutes per target and configuration; --no-openvino
skips it).

At temperature 0.7 the configurations' outputs differ (each samples the target's distribution, but drafts use
the request's randomness differently): with the seed fixed per prompt a fixed-k configuration samples the same
text in every run, while auto's text moves with its k choices, so with one seed a part's ratio at few rows also
compared easier text with harder (fp32, one stream: 0.87-0.93 over 4-8 parts, while auto ran 1.11x k = 5 in an
interleaved A/B of 16 paired runs on other prompts; results/trust/batch-s33). So at T > 0 every prompt of a part
runs with ceil(8 / c) seeds (--texts 8), the same seeds for every configuration, each seed's runs interleaved
ABBA, and a configuration's part pools them: at least 8 sampled texts per configuration per part at every
concurrency (one seed at 8 rows, as before; 8 at one row, so c = 1 and 2 take 8x and 4x longer at T > 0).
fp32 at one stream then read 1.054 (results/trust/batch-s34-texts).

The batch-1 engine of the commit before the batch engine (--baseline REV, run from a git worktree in a
child process) is measured at concurrency 1 on the same prompts, alternating with this engine, for the
"within 5% of today's engine" check. Writes <out>/batch.json, batch.md and batch.png.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchkit as kit
import peer_openvino as ov

BUNDLES = {  # the bundles scripts/demo.sh exports (standard graph)
    "fp32": kit.ROOT / "engines/qwen2.5-coder-1.5b-fp32",
    "int4": kit.ROOT / "engines/qwen2.5-coder-1.5b-int4",
    "draft": kit.ROOT / "engines/qwen2.5-coder-0.5b-int4",
}
CONFIGS = {"plain": 0, "k=3": 3, "k=5": 5, "auto": None}
NEW_TOKENS = 128
TEXTS = 8  # sampled texts per configuration in a part at T > 0 (--texts)
SEED_STRIDE = 1000  # a prompt's seeds: i, i + 1000, ... (seed 0 is the only one at T = 0)


# ---------------------------------------------------------------- specrt


def run_specrt(
    engine,
    concurrency: int,
    k: int | None,
    temperature: float,
    jobs: list,
    outputs: dict | None = None,
    seed: int = 0,
) -> dict:
    """One part: `jobs` ((prompt index, prompt) pairs) from c client threads, request i seeded with
    i + SEED_STRIDE * seed. `outputs` (prompt index -> token ids) collects what each request generated, for the
    comparison with single-stream output."""
    import specrt

    def request(job: tuple[int, tuple[str, bool, str]]) -> dict:
        i, (text, chat, _) = job
        options = specrt.GenerationOptions(
            max_new_tokens=NEW_TOKENS,
            num_draft_tokens=k,
            temperature=temperature,
            seed=i + SEED_STRIDE * seed,
            ignore_eos=True,
        )
        t0 = time.perf_counter()
        gen = engine.generate(text, options, chat=chat)
        first = None
        for _ in gen:
            first = first or time.perf_counter()
        end = time.perf_counter()
        if outputs is not None:
            outputs[i] = list(gen.token_ids)
        return {"ttft": (first or end) - t0, "s": end - t0, "tokens": len(gen.token_ids)}

    before = engine.stats
    results, wall = kit.run_clients(request, jobs, concurrency)
    after = engine.stats
    ks = {int(k): v - before["k_chosen"].get(k, 0) for k, v in after["k_chosen"].items()}
    sizes = {int(b): v - before["batch_sizes"].get(b, 0) for b, v in after["batch_sizes"].items()}
    return {"results": results, "wall": wall, "k_chosen": ks, "batch_sizes": sizes}


def summary(results: list[dict], wall: float) -> dict:
    tokens = sum(r["tokens"] for r in results)
    return {
        "requests": len(results),
        "total_tokens_per_s": tokens / wall,
        "per_request_tokens_per_s": statistics.median(r["tokens"] / r["s"] for r in results),
        "ttft_p50_s": kit.percentile([r["ttft"] for r in results], 0.5),
        "ttft_p99_s": kit.percentile([r["ttft"] for r in results], 0.99),
        "wall_s": wall,
    }


def seeds_per_part(concurrency: int, temperature: float, texts: int) -> int:
    """Seeds each prompt of a part runs with: one when greedy (one text per prompt), else enough that every
    configuration samples at least `texts` texts in the part (8 rows: one seed; one row: eight)."""
    return 1 if temperature == 0 else max(1, -(-texts // concurrency))


def join_runs(runs: list[dict]) -> dict:
    """Runs of one configuration as one (a part's seeds, or a level's parts): requests pooled, walls and the
    rounds per k and batch sizes added up."""
    joined: dict = {"results": [], "wall": 0.0, "k_chosen": {}, "batch_sizes": {}}
    for run in runs:
        joined["results"] += run["results"]
        joined["wall"] += run["wall"]
        for key in ("k_chosen", "batch_sizes"):
            for k, v in run[key].items():
                joined[key][k] = joined[key].get(k, 0) + v
    return joined


def merge_parts(parts: list[dict]) -> dict:
    """One configuration's parts of a level as one row: the summary over all its requests (wall times
    summed), the rounds per k and batch sizes added up, and each part's total tokens/s."""
    joined = join_runs(parts)
    return summary(joined["results"], joined["wall"]) | {
        "k_chosen": {k: v for k, v in sorted(joined["k_chosen"].items()) if v},
        "batch_sizes": {b: v for b, v in sorted(joined["batch_sizes"].items()) if v},
        "parts_tokens_per_s": [sum(r["tokens"] for r in p["results"]) / p["wall"] for p in parts],
    }


def auto_vs_best(rows: dict[str, dict]) -> float:
    """Median over parts of auto's tokens/s over the best fixed configuration's in the same part (a ratio
    of runs minutes apart, not of whole columns run at different times)."""
    fixed = [name for name in rows if name != "auto"]
    per_part = zip(rows["auto"]["parts_tokens_per_s"], *(rows[n]["parts_tokens_per_s"] for n in fixed), strict=True)
    return statistics.median(auto / max(others) for auto, *others in per_part)


def warm_up(engine, c: int) -> None:
    """Untimed runs before a level's parts."""
    import specrt

    warm = list(enumerate(kit.mixed_prompts(c)))
    # Alone: auto k measures the cost profiles missing for this machine here (t(B, S) up to B = c over all
    # slots, once; saved in the bundle), as a server does on its first request.
    run_specrt(engine, 1, None, 0.0, warm[:1])
    # ...and one level at full concurrency: ONNX Runtime's first runs at the batch's shapes grow its memory
    # arenas (measured: the first timed level of a fresh engine at c = 4, 8 ran 15-20% slow).
    run_specrt(engine, c, 0, 0.0, warm)
    engine.complete("def f(x):", specrt.GenerationOptions(max_new_tokens=4))


def worker(
    target: str, levels: list[int], temperatures: list[float], parts: int, out: Path, texts: int = TEXTS
) -> None:
    """One target precision in its own process (its peak RSS is its own)."""
    import specrt

    rows = []

    def save() -> None:
        out.write_text(json.dumps({"rows": rows, "peak_rss_gib": kit.peak_rss_gib()}))

    for c in levels:
        engine = specrt.load(BUNDLES[target], BUNDLES["draft"], max_batch=c)
        warm_up(engine, c)
        prompts = list(enumerate(kit.mixed_prompts(parts * c)))
        for temperature in temperatures:
            done: dict[str, list[dict]] = {name: [] for name in CONFIGS}
            outputs: dict[str, dict[int, list[int]]] = {name: {} for name in CONFIGS}
            seeds = seeds_per_part(c, temperature, texts)
            for part in range(parts):
                jobs = prompts[part * c : (part + 1) * c]
                runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
                for seed in range(seeds):
                    for name in kit.interleave(CONFIGS, c + part * seeds + seed):
                        kit.log(f"{target} c={c} T={temperature} part {part + 1}/{parts} seed {seed} {name}")
                        engine.reset()  # no configuration finds its prompts cached by the one before it
                        got = run_specrt(engine, c, CONFIGS[name], temperature, jobs, outputs[name], seed)
                        runs[name].append(got)
                        tokens = sum(r["tokens"] for r in got["results"])
                        ks = {k: v for k, v in got["k_chosen"].items() if v}
                        kit.log(f"  {tokens / got['wall']:.1f} tok/s total, k {ks}")
                for name in CONFIGS:
                    done[name].append(join_runs(runs[name]))
            level = {name: merge_parts(done[name]) for name in CONFIGS}
            level["auto"]["auto_vs_best"] = auto_vs_best(level)
            kit.log(f"{target} c={c} T={temperature}: auto / best fixed {level['auto']['auto_vs_best']:.3f}")
            for name, row in level.items():
                cell = {"target": target, "concurrency": c, "temperature": temperature, "config": name, "seeds": seeds}
                rows.append(cell | row)
                if temperature == 0:  # compared with single-stream outputs later, in a process of its own
                    rows[-1]["outputs"] = {str(i): out for i, out in outputs[name].items()}
        del engine
        gc.collect()  # the level's engine goes before the next one loads (fp32: ~6 GiB of weights and arenas)
        # Written after every level: a worker killed later (the OOM killer took fp32 workers near this
        # VM's 23 GiB in the single-stream comparison) leaves what it measured.
        save()


def worker_rows(raw: Path) -> list[dict]:
    """A worker's rows for the report: with its peak RSS, without the outputs kept for the comparison."""
    data = json.loads(raw.read_text())
    peak = {"peak_rss_gib": data["peak_rss_gib"]}
    return [{k: v for k, v in r.items() if k != "outputs"} | peak for r in data["rows"]]


def compare_with_single_stream(target: str, raw: Path) -> None:
    """Every greedy output of the batched runs (the rows' `outputs` in the worker's raw file) against the
    same prompt's single-stream target-only output (max_batch 1, k = 0). Each such row gets `differences`:
    per differing request, the first differing position and the target's top-2 logit margin there (batched
    kernels may round a near-tie differently; a difference at a large margin is a bug). Run in a process of
    its own: in the worker, after the levels, the fp32 engine's arenas had not gone back and the OOM killer
    took it near this VM's 23 GiB."""
    import specrt
    from specrt.decoding.divergence import divergence

    data = json.loads(raw.read_text())
    greedy = [(row, {int(i): out for i, out in row.pop("outputs").items()}) for row in data["rows"] if "outputs" in row]
    used = sorted({i for _, outputs in greedy for i in outputs})
    if not used:
        return
    engine = specrt.load(BUNDLES[target], max_batch=1)
    prompts = kit.mixed_prompts(max(used) + 1)
    options = specrt.GenerationOptions(max_new_tokens=NEW_TOKENS, num_draft_tokens=0, ignore_eos=True)
    kit.log(f"{target}: single-stream target-only outputs of {len(used)} prompts")
    ids = {i: engine.encode(prompts[i][0], chat=prompts[i][1]) for i in used}
    reference = {i: list(engine.complete(ids[i], options).token_ids) for i in used}
    for row, outputs in greedy:
        row["differences"] = [
            {"prompt": i} | divergence(engine.target, ids[i], reference[i], out)
            for i, out in sorted(outputs.items())
            if out != reference[i]
        ]
        row["greedy_compared"] = len(outputs)
    raw.write_text(json.dumps(data))


# ---------------------------------------------------------------- llama.cpp


def run_llamacpp(levels: list[int], temperatures: list[float]) -> list[dict]:
    bin_dir = kit.llamacpp_bin()
    if bin_dir is None:
        kit.log("llama.cpp is not built (bash scripts/build_llamacpp.sh): skipping llama-server")
        return []
    import specrt

    tok = specrt.open_bundle(BUNDLES["int4"]).load_tokenizer()
    rows = []
    for draft in (False, True):
        for c in levels:
            server, url = kit.start_server(kit.llama_server_cmd(bin_dir, c, 5 if draft else 0), timeout=300, poll=0.5)
            try:
                llamacpp_level(url, tok, 1, 0.0, n=1)  # warm-up, as the specrt engines get
                for temperature in temperatures:
                    name = "llama-server + draft k=5" if draft else "llama-server"
                    kit.log(f"{name} c={c} T={temperature}")
                    row = llamacpp_level(url, tok, c, temperature)
                    rows.append(
                        {"target": "Q4_K_M", "concurrency": c, "temperature": temperature, "config": name} | row
                    )
                    kit.log(f"  {row['total_tokens_per_s']:.1f} tok/s total")
            finally:
                server.terminate()
                _, peak = kit.wait_child(server)
            for r in rows[-len(temperatures) :]:
                r["peak_rss_gib"] = peak
    return rows


def llamacpp_level(url: str, tok, concurrency: int, temperature: float, n: int | None = None) -> dict:
    def request(job: tuple[int, tuple[str, bool, str]]) -> dict:
        i, (text, chat, _) = job
        ids = tok.encode_chat(text) if chat else tok.encode(text)
        body = {"prompt": ids, "n_predict": NEW_TOKENS, "temperature": temperature, "seed": i}
        body |= {"ignore_eos": True, "cache_prompt": False, "stream": True}
        t0, first, tokens = time.perf_counter(), None, 0
        with kit.post(f"{url}/completion", body, 900) as r:
            for data in kit.sse_events(r):
                if "content" in data:
                    first = first or time.perf_counter()
                    tokens = max(tokens, data.get("tokens_predicted", tokens))
        end = time.perf_counter()
        return {"ttft": (first or end) - t0, "s": end - t0, "tokens": tokens or NEW_TOKENS}

    return summary(*kit.run_clients(request, enumerate(kit.mixed_prompts(n or 2 * concurrency)), concurrency))


# ---------------------------------------------------------------- OpenVINO GenAI


def run_openvino(out: Path, levels: list[int], temperatures: list[float], targets: list[str]) -> list[dict]:
    """Each OpenVINO configuration in a child process under its venv (its peak RSS is its own), fed the same
    token ids as llama-server gets (specrt's tokenizer; any bundle of the target has it)."""
    import specrt

    ov.prepare()
    bundle = next((b for b in (BUNDLES["int4"], kit.ROOT / "engines/qwen2.5-coder-1.5b-int4") if b.exists()), None)
    if bundle is None:
        sys.exit(f"error: no target bundle for the prompts' token ids: export {BUNDLES['int4']} (scripts/demo.sh)")
    tok = specrt.open_bundle(bundle).load_tokenizer()
    prompts = [tok.encode_chat(t) if chat else tok.encode(t) for t, chat, _ in kit.mixed_prompts(2 * max(levels))]
    (out / "openvino-prompts.json").write_text(json.dumps(prompts))
    rows = []
    for target in targets:
        for config in ov.BATCH_CONFIGS:
            raw = out / f"raw-openvino-{target}-k{ov.BATCH_CONFIGS[config]}.json"
            cmd = [str(ov.PYTHON), __file__, "--worker", f"openvino-{target}", "--openvino-config", config]
            cmd += ["--out", str(out), "--concurrency", *map(str, levels), "--temperatures", *map(str, temperatures)]
            cmd += ["--new-tokens", str(NEW_TOKENS)]
            code, peak = kit.wait_child(subprocess.Popen(cmd))
            if code != 0:
                sys.exit(f"error: the OpenVINO {target} {config} worker exited {code}; see its output above")
            rows += [r | {"peak_rss_gib": peak} for r in json.loads(raw.read_text())]
    return rows


def openvino_worker(target: str, config: str, out: Path, levels: list[int], temperatures: list[float]) -> None:
    """Under the OpenVINO venv: one configuration's rows into <out>/raw-openvino-<target>-k<k>.json."""
    prompts = json.loads((out / "openvino-prompts.json").read_text())
    rows = ov.worker_batch(target, config, levels, temperatures, prompts, NEW_TOKENS, summary)
    (out / f"raw-openvino-{target}-k{ov.BATCH_CONFIGS[config]}.json").write_text(json.dumps(rows))


# ---------------------------------------------------------------- batch 1: this engine against the one before it

SERVE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import specrt
engine = specrt.load(sys.argv[2], sys.argv[3])
print("ready", flush=True)
for line in sys.stdin:
    text, chat = json.loads(line)
    options = specrt.GenerationOptions(max_new_tokens=%d, ignore_eos=True)
    engine.reset()
    gen = engine.complete(text, options, chat=chat)
    print(json.dumps(len(gen.token_ids) / gen.stats.total_s), flush=True)
"""


def baseline_revision() -> str:
    """The commit before the batch engine (the parent of the commit that added specrt/scheduler.py)."""
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "specrt/scheduler.py", "specrt/engine/scheduler.py"],
        cwd=kit.ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[-1]
    return f"{added}~1"


def compare_batch_one(target: str, rev: str, repeats: int = 2) -> dict:
    """Auto k, batch 1, the same prompts: this checkout and `rev` (a git worktree), each in a process of its
    own, asked in alternation (ABBA) prompt by prompt. Returns median tokens/s of each and their ratio."""
    tree = Path(f"/tmp/specrt-baseline-{rev.replace('~', '-')}")
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=kit.ROOT, check=True)
    procs = {}
    for name, path in (("baseline", tree), ("this", kit.ROOT)):
        cmd = [sys.executable, "-c", SERVE % NEW_TOKENS, str(path), str(BUNDLES[target]), str(BUNDLES["draft"])]
        procs[name] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert procs[name].stdout.readline().strip() == "ready"
    speeds = {name: [] for name in procs}
    for rep in range(repeats):
        for i, (text, chat, _) in enumerate(kit.mixed_prompts(8)):
            for name in kit.interleave(procs, rep + i + 1):
                procs[name].stdin.write(json.dumps([text, chat]) + "\n")
                procs[name].stdin.flush()
                speeds[name].append(json.loads(procs[name].stdout.readline()))
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    ratios = [a / b for a, b in zip(speeds["this"], speeds["baseline"], strict=True)]
    return {
        "target": target,
        "baseline": rev,
        "this_tokens_per_s": statistics.median(speeds["this"]),
        "baseline_tokens_per_s": statistics.median(speeds["baseline"]),
        "ratio_median": statistics.median(ratios),
    }


# ---------------------------------------------------------------- which model of t(B, S) fits


def fit_report(name: str, path: Path, max_batch: int = 8) -> dict:
    """The measured t(B, S) of a bundle against two ways of predicting it: the profile's interpolation
    between measured batch sizes (leave B = 4 out, predict it from B = 2 and 8) and a linear model of total
    tokens plus a per-row term (least squares over every point but B = 4). Relative errors at B = 4."""
    import numpy as np

    import specrt
    from specrt.runtime.session import ModelSession, SessionOptions
    from specrt.tuning.measure import measure_batches
    from specrt.tuning.profile import BatchProfile

    session = ModelSession(specrt.open_bundle(path), SessionOptions(spin_between_runs=False), rows=max_batch)
    prof = measure_batches(session, [1, 2, 4, 8], list(range(1, 10)), [512], reps=3).profiles[0]
    del session
    grid = {(b, w): prof.ms[i][j] for i, b in enumerate(prof.batches) for j, w in enumerate(prof.widths)}
    held = [(4, w) for w in prof.widths]
    rest = [k for k in grid if k[0] != 4]
    kept = [(b, r) for b, r in zip(prof.batches, prof.ms, strict=True) if b != 4]
    without = BatchProfile([b for b, _ in kept], prof.widths, [r for _, r in kept])
    a = np.array([[1.0, b * w, b] for b, w in rest])
    coef, *_ = np.linalg.lstsq(a, np.array([grid[k] for k in rest]), rcond=None)
    interp = [abs(without(b, w) - grid[b, w]) / grid[b, w] for b, w in held]
    linear = [abs(coef @ [1.0, b * w, b] - grid[b, w]) / grid[b, w] for b, w in held]
    return {
        "model": name,
        "profile": {"batches": prof.batches, "widths": prof.widths, "ms": prof.ms},
        "linear_ms": {"fixed": coef[0], "per_token": coef[1], "per_row": coef[2]},
        "interpolation_error_max": max(interp),
        "interpolation_error_median": statistics.median(interp),
        "linear_error_max": max(linear),
        "linear_error_median": statistics.median(linear),
    }


# ---------------------------------------------------------------- report


def report(rows: list[dict], command: str) -> str:
    levels = sorted({r["concurrency"] for r in rows})
    md = [f"Command: `{command}`", "", f"{NEW_TOKENS} new tokens per request.", ""]
    md += auto_table(rows, levels)
    for temperature in sorted({r["temperature"] for r in rows}):
        md += [f"Total output tokens/s, temperature {temperature} (TTFT p50 s):", ""]
        md.append("| target | configuration | " + " | ".join(f"c={c}" for c in levels) + " |")
        md.append("|---" * (len(levels) + 2) + "|")
        keys = dict.fromkeys((r["target"], r["config"]) for r in rows if r["temperature"] == temperature)
        for target, config in keys:
            cells = []
            for c in levels:
                r = next(
                    (
                        r
                        for r in rows
                        if (r["target"], r["config"], r["concurrency"], r["temperature"])
                        == (target, config, c, temperature)
                    ),
                    None,
                )
                cells.append("-" if r is None else f"{r['total_tokens_per_s']:.1f} ({r['ttft_p50_s']:.2f})")
            md.append(f"| {target} | {config} | " + " | ".join(cells) + " |")
        md.append("")
    md += ["Greedy outputs against single-stream target-only output of the same prompt:", ""]
    for r in rows:
        if "differences" in r:
            where = f"{r['target']} {r['config']} c={r['concurrency']}"
            diffs = ", ".join(
                f"prompt {d['prompt']} from token {d['position']} (top-2 margin {d['top2_margin']:.3f})"
                for d in r["differences"]
            )
            md.append(
                f"- {where}: {r['greedy_compared'] - len(r['differences'])}/{r['greedy_compared']} equal"
                + (f"; {diffs}" if diffs else "")
            )
    md += ["", "k chosen by auto (row-rounds per k) and batch sizes seen:", ""]
    for r in rows:
        if r["config"] == "auto":
            where = f"{r['target']} c={r['concurrency']} T={r['temperature']}"
            md.append(f"- {where}: k {r['k_chosen']}, batch {r['batch_sizes']}")
    return "\n".join(md) + "\n"


def auto_table(rows: list[dict], levels: list[int]) -> list[str]:
    """Auto k against the best of plain, k = 3 and k = 5 per cell (median of per-part ratios), and how many
    cells reach 0.95 and the lowest."""
    cells = {(r["target"], r["temperature"], r["concurrency"]): r["auto_vs_best"] for r in rows if "auto_vs_best" in r}
    if not cells:
        return []
    parts = max(len(r.get("parts_tokens_per_s", [])) for r in rows)
    md = [
        f"Auto k / the best of plain, k=3, k=5 (median over {parts} interleaved parts of the ratio within a part):",
        "",
        "| target | temperature | " + " | ".join(f"c={c}" for c in levels) + " |",
        "|---" * (len(levels) + 2) + "|",
    ]
    for target, temperature in dict.fromkeys((t, T) for t, T, _ in cells):
        got = [cells.get((target, temperature, c)) for c in levels]
        md.append(f"| {target} | {temperature} | " + " | ".join("-" if g is None else f"{g:.3f}" for g in got) + " |")
    values = list(cells.values())
    md += ["", f"{sum(v >= 0.95 for v in values)} of {len(values)} cells >= 0.95; lowest {min(values):.3f}."]
    seeds = {(r["temperature"], r["concurrency"]): r["seeds"] for r in rows if "seeds" in r and r["temperature"] > 0}
    if seeds:  # rows written before --texts ran one seed per prompt
        told = ", ".join(f"c={c}: {n}" for (_, c), n in sorted(seeds.items()))
        md.append(f"Seeds per prompt at T > 0 (the same for every configuration; a part's run pools them): {told}.")
    return md + [""]


def chart(rows: list[dict], path: Path) -> None:
    plt = kit.pyplot()
    if plt is None:
        return
    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(7 * len(temps), 5), squeeze=False)
    for ax, temperature in zip(axes[0], temps, strict=True):
        for key in dict.fromkeys((r["target"], r["config"]) for r in rows):
            pts = sorted(
                (r["concurrency"], r["total_tokens_per_s"])
                for r in rows
                if (r["target"], r["config"]) == key and r["temperature"] == temperature
            )
            ax.plot(*zip(*pts, strict=True), marker="o", label=" ".join(key))
        ax.set_title(f"temperature {temperature}")
        kit.concurrency_axes(ax, "total output tokens/s", 7)
    kit.save_figure(fig, path)


def main() -> int:
    global NEW_TOKENS  # every measurement in this process and its workers asks for this many
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=kit.ROOT / "results/batch")
    parser.add_argument("--targets", nargs="*", default=["int4", "fp32"], choices=["int4", "fp32"])
    parser.add_argument("--concurrency", nargs="*", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--temperatures", nargs="*", type=float, default=[0.0, 0.7])
    parser.add_argument("--parts", type=int, default=2, help="interleaved parts of c requests per level")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="new tokens per request")
    parser.add_argument(
        "--texts",
        type=int,
        default=TEXTS,
        help="at T > 0, sampled texts per configuration in a part: each prompt runs with ceil(texts / c) seeds, "
        "the same for every configuration (1: one seed per prompt)",
    )
    parser.add_argument("--no-llamacpp", action="store_true")
    parser.add_argument("--no-openvino", action="store_true")
    parser.add_argument("--openvino-targets", nargs="*", default=["gguf", "ir"], choices=["gguf", "ir"])
    parser.add_argument("--no-fit", action="store_true", help="skip the t(B, S) model comparison")
    parser.add_argument("--no-baseline", action="store_true", help="skip the batch-1 comparison with the old engine")
    parser.add_argument("--baseline", default=None, help="git revision of the engine to compare batch 1 with")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite batch.md/png from <out>/batch.json, with each target's rows read again from its "
        "raw-<target>.json (after `--worker <target>` re-measured one target)",
    )
    parser.add_argument("--only-llamacpp", action="store_true", help="measure llama-server again into <out>")
    parser.add_argument("--only-openvino", action="store_true", help="measure OpenVINO again into <out>")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compare", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--openvino-config", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    NEW_TOKENS = args.new_tokens
    if args.worker and args.worker.startswith("openvino-"):  # under the OpenVINO venv
        target = args.worker.removeprefix("openvino-")
        openvino_worker(target, args.openvino_config, args.out, args.concurrency, args.temperatures)
        return 0
    if args.compare:
        compare_with_single_stream(args.compare, args.out / f"raw-{args.compare}.json")
        return 0
    if args.worker:
        worker(
            args.worker,
            args.concurrency,
            args.temperatures,
            args.parts,
            args.out / f"raw-{args.worker}.json",
            args.texts,
        )
        return 0
    if args.only_llamacpp or args.only_openvino:  # one peer measured again, the rest of <out>/batch.json kept
        data = json.loads((args.out / "batch.json").read_text())
        if args.only_llamacpp:
            rows = [r for r in data["rows"] if not r["config"].startswith("llama-server")]
            rows += run_llamacpp(args.concurrency, args.temperatures)
        else:
            again = {ov.BATCH_TARGETS[t] for t in args.openvino_targets}
            rows = [r for r in data["rows"] if r["target"] not in again]
            rows += run_openvino(args.out, args.concurrency, args.temperatures, args.openvino_targets)
        write(args.out, data["command"], rows, data["batch_one"], data["fits"])
        return 0
    if args.report_only:
        data = json.loads((args.out / "batch.json").read_text())
        rows = []
        for target in ("int4", "fp32"):
            raw = args.out / f"raw-{target}.json"
            if raw.is_file():
                rows += worker_rows(raw)
        rows += [r for r in data["rows"] if r["target"] not in ("int4", "fp32")]  # the peers'
        write(args.out, data["command"], rows, data["batch_one"], data["fits"])
        return 0
    rows = []
    for target in args.targets:
        cmd = [sys.executable, __file__, "--worker", target, "--out", str(args.out), "--concurrency"]
        cmd += [str(c) for c in args.concurrency] + ["--temperatures"] + [str(t) for t in args.temperatures]
        cmd += ["--parts", str(args.parts), "--new-tokens", str(NEW_TOKENS), "--texts", str(args.texts)]
        raw = args.out / f"raw-{target}.json"
        raw.unlink(missing_ok=True)
        if subprocess.run(cmd).returncode:  # what it wrote before it died is reported, and said to be partial
            if not raw.is_file():
                sys.exit(f"the {target} worker failed before it measured a level (see its output above)")
            kit.log(f"the {target} worker failed: reporting the levels it wrote")
        compare = [sys.executable, __file__, "--compare", target, "--out", str(args.out)]
        if subprocess.run(compare + ["--new-tokens", str(NEW_TOKENS)]).returncode:
            kit.log(f"the {target} greedy comparison failed: its rows are reported without one")
        rows += worker_rows(raw)
    if not args.no_llamacpp:
        rows += run_llamacpp(args.concurrency, args.temperatures)
    if not args.no_openvino:
        rows += run_openvino(args.out, args.concurrency, args.temperatures, args.openvino_targets)
    fits = [fit_report(name, BUNDLES[name]) for name in (*args.targets, "draft")] if not args.no_fit else []
    rev = args.baseline or baseline_revision()
    batch_one = [compare_batch_one(target, rev) for target in args.targets] if not args.no_baseline else []
    command = kit.command_line()
    write(args.out, command, rows, batch_one, fits)
    return 0


def write(out: Path, command: str, rows: list[dict], batch_one: list[dict], fits: list[dict]) -> None:
    data = {"command": command, "rows": rows, "batch_one": batch_one, "fits": fits}
    md = report(rows, command)
    for b in batch_one:
        md += (
            f"\nBatch 1, auto k, {b['target']} target, alternating with the engine of {b['baseline']}: "
            f"{b['this_tokens_per_s']:.2f} vs {b['baseline_tokens_per_s']:.2f} tok/s, "
            f"median ratio {b['ratio_median']:.3f}\n"
        )
    for f in fits:
        md += (
            f"\nt(B, S) of the {f['model']} model at B = 4, predicted from B = 1, 2, 8: interpolating the "
            f"profile errs by {100 * f['interpolation_error_median']:.0f}% (median; max "
            f"{100 * f['interpolation_error_max']:.0f}%), a linear model of total tokens and rows by "
            f"{100 * f['linear_error_median']:.0f}% (max {100 * f['linear_error_max']:.0f}%).\n"
        )
    kit.write_outputs(out, "batch", md, data, lambda path: chart(rows, path))


if __name__ == "__main__":
    sys.exit(main())
