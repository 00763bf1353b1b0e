#!/usr/bin/env python
"""Side-by-side benchmark of specrt against the tools users would pick instead, in one run.

    python scripts/bench_peers.py --out results/            # everything (about 2 hours on 2 cores)
    python scripts/bench_peers.py --only specrt-int4        # one configuration

Configurations (same prompts, greedy, batch 1, N new tokens, EOS ignored; the peers are fed the token ids
of specrt's tokenizer, which encodes exactly as transformers' GGUF tokenizer does):
  transformers-fp32        transformers PyTorch fp32 target alone
  transformers-assisted    transformers assisted generation, fp32 target + fp32 draft
  genai-int4               onnxruntime-genai int4 target alone, and with its int4 draft (k = 3, 5)
  llamacpp                 llama.cpp's llama-server on the GGUF target alone, and with the GGUF draft
                           (draft-simple, k = 3, 5); built once by scripts/build_llamacpp.sh
  openvino-gguf            OpenVINO GenAI reading the GGUF target itself, alone; with its int4 IR draft at
                           k = 3, 5 (num_assistant_tokens) and dynamic (assistant_confidence_threshold 0.4);
                           and prompt lookup (k = 3, 5, n-grams up to 3); see scripts/peer_openvino.py
  openvino-ir              the same modes on OpenVINO's own int4 IR of the target (optimum-intel)
  specrt-fp32              specrt fp32 target alone, and with the int4 draft for each k
  specrt-int4              specrt int4 target alone, and with the int4 draft for each k
  specrt-native            specrt GGUF-native target (the file's own Q4_K/Q6_K blocks) alone, and with the
                           int4 draft for each k: what llama.cpp computes with, weight for weight
  specrt-fp32-ngram        specrt fp32 target with prompt lookup (n-gram) drafting, auto k
  specrt-int4-ngram        specrt int4 target with prompt lookup (n-gram) drafting, auto k
  specrt-fp32-both         specrt fp32 target with n-gram and int4 draft model, auto k (per round, the
  specrt-int4-both         drafter whose cost model promises more tokens/s drafts)
--profile-x T D runs the specrt configurations on bundles as an export on a busy machine leaves them: hard-linked
copies whose stored step-cost profiles are T (target) and D (draft) times too slow (scripts/busy_bundles.py, in a
temporary folder; what the engine measures again and stores goes there, never into engines/).
Each configuration runs in its own process, so its peak RSS (os.wait4) is its own. Output in --out:
results.json, results.md (the tables) and results.png (tokens/s per prompt).
--reuse CONFIG... takes those configurations' measurements from an earlier run in the same --out (its
raw/CONFIG.json) instead of running them again (transformers takes a third of the time and does not change
with specrt); the report names them and when they were measured.

Inputs: the GGUFs from scripts/fetch_models.py and the specrt bundles from scripts/demo.sh. The peers need
Hugging Face folders, made once from the GGUFs (models/hf/), and onnxruntime-genai models built once with
its own builder from those folders (engines/genai/); both are skipped when present. The OpenVINO rows run
under a venv of their own with IRs converted from those folders, made once outside the repository by
`.venv/bin/python scripts/peer_openvino.py prepare` (also called here when needed). Their greedy-equality
lines compare each speculative and lookup row with OpenVINO's own target-only output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchkit as kit
import peer_openvino as ov

HF = {role: kit.ROOT / "models/hf" / path.stem for role, path in kit.GGUF.items()}
BUNDLES = {
    "target-fp32": kit.ROOT / "engines/qwen2.5-coder-1.5b-fp32",
    "target-int4": kit.ROOT / "engines/qwen2.5-coder-1.5b-int4",
    "target-native": kit.ROOT / "engines/qwen2.5-coder-1.5b-native",
    "draft-int4": kit.ROOT / "engines/qwen2.5-coder-0.5b-int4",
}
GENAI = {role: kit.ROOT / "engines/genai" / f"{role}-int4" for role in ("target", "draft")}
# specrt workers: name -> (target precision, drafters, k configurations; None = auto)
SPECRT = {
    "specrt-fp32": ("fp32", ["model"], [None, 3, 5]),
    "specrt-fp32-ngram": ("fp32", ["ngram"], [None]),
    "specrt-int4": ("int4", ["model"], [None, 2, 4]),
    "specrt-native": ("native", ["model"], [None, 2, 4]),
    "specrt-int4-ngram": ("int4", ["ngram"], [None]),
    "specrt-fp32-both": ("fp32", ["ngram", "model"], [None]),
    "specrt-int4-both": ("int4", ["ngram", "model"], [None]),
}
CONFIGS = ["transformers-fp32", "transformers-assisted", "genai-int4", "llamacpp", *ov.PEER_TARGETS, *SPECRT]
LLAMACPP_KS = [3, 5]


# ---------------------------------------------------------------- preparation (once, cached on disk)


def prepare_hf_folders() -> None:
    """Hugging Face folders from the GGUFs: the peers' input (transformers can load GGUF, but saving once
    makes every later load fast, and the genai builder needs a folder)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for role, gguf in kit.GGUF.items():
        out = HF[role]
        if (out / "config.json").exists():
            continue
        print(f"making {out} from {gguf.name}", flush=True)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        model.hf_quantizer = None  # save_pretrained refuses GGUF-loaded models otherwise
        model.config.quantization_config = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
        del model


def prepare_genai() -> bool:
    """onnxruntime-genai int4 models built by its own builder (default CPU settings)."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        print("onnxruntime-genai is not installed (pip install 'specrt[bench]'): skipping its rows")
        return False
    for role, out in GENAI.items():
        if (out / "genai_config.json").exists():
            continue
        print(f"building {out} with the onnxruntime-genai builder", flush=True)
        cmd = [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(HF[role]),
            "-o",
            str(out),
            "-p",
            "int4",
            "-e",
            "cpu",
            "-c",
            str(kit.ROOT / "engines/genai/cache"),
        ]
        subprocess.run(cmd, check=True)
    spec = kit.ROOT / "engines/genai/spec-int4"
    if not (spec / "genai_config.json").exists():
        import shutil

        shutil.copytree(GENAI["target"], spec, dirs_exist_ok=True)
        draft_cfg = json.loads((GENAI["draft"] / "genai_config.json").read_text())["model"]["decoder"]
        for f in GENAI["draft"].iterdir():
            if f.name.startswith("model.onnx"):
                shutil.copy(f, spec / f.name.replace("model.onnx", "draft.onnx"))
        draft_cfg["filename"] = "draft.onnx"
        cfg = json.loads((spec / "genai_config.json").read_text())
        cfg["model"]["draft"] = draft_cfg
        (spec / "genai_config.json").write_text(json.dumps(cfg, indent=1))
        # The external-data reference inside draft.onnx must follow the renamed file.
        import onnx

        model = onnx.load(str(spec / "draft.onnx"), load_external_data=False)
        for t in model.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = e.value.replace("model.onnx", "draft.onnx")
        onnx.save(model, str(spec / "draft.onnx"))
    return True


# ---------------------------------------------------------------- workers (one process each)


def _timed(fn, repeats: int) -> tuple[list[float], object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def worker_transformers(prompts: list[dict], n: int, repeats: int, assisted: bool) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    target = AutoModelForCausalLM.from_pretrained(HF["target"], dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(HF["draft"], dtype=torch.float32).eval() if assisted else None
    extra = {"assistant_model": draft} if assisted else {}
    rows = []
    with torch.no_grad():
        warm = torch.tensor([prompts[0]["ids"]])
        target.generate(warm, max_new_tokens=8, do_sample=False, **extra)
        for p in prompts:
            ids = torch.tensor([p["ids"]])

            def run(ids=ids):
                return target.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                    **extra,
                )

            times, out = _timed(run, repeats)
            tokens = out[0, ids.shape[1] :].tolist()
            rows.append(
                {
                    "prompt": p["name"],
                    "config": "target+draft" if assisted else "target-only",
                    "tokens_per_s": n / statistics.median(times),
                    "token_ids": tokens,
                }
            )
    return rows


def worker_genai(prompts: list[dict], n: int, repeats: int, ks: list[int]) -> list[dict]:
    import numpy as np
    import onnxruntime_genai as og

    rows = []
    for k in [0, *ks]:
        model = og.Model(str(GENAI["target"] if k == 0 else kit.ROOT / "engines/genai/spec-int4"))

        def run(ids, k=k, model=model, length=n):
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=len(ids) + length, min_length=len(ids) + length, do_sample=False)
            if k:
                params.set_speculative_options(max_draft_tokens=k)
            g = og.Generator(model, params)
            g.append_tokens(np.array([ids], np.int32))
            while not g.is_done():
                g.generate_next_token()
            return list(map(int, g.get_sequence(0)))[len(ids) :], (g.get_speculative_stats() if k else {})

        run(prompts[0]["ids"], length=8)
        for p in prompts:
            times, (tokens, st) = _timed(lambda p=p: run(p["ids"]), repeats)
            rows.append(
                {
                    "prompt": p["name"],
                    "config": "target-only" if k == 0 else f"k={k}",
                    "tokens_per_s": n / statistics.median(times),
                    "token_ids": tokens,
                    "acceptance_rate": st.get("acceptance_rate"),
                    "tokens_per_pass": st.get("mean_emitted_tokens_per_round"),
                }
            )
        del model
    return rows


def worker_llamacpp(prompts: list[dict], n: int, repeats: int, ks: list[int]) -> list[dict]:
    """llama-server on 127.0.0.1, one configuration at a time: the GGUF target alone, then with the GGUF
    draft (draft-simple, k tokens). Prompts go in as token ids (the same ids every configuration gets);
    greedy (temperature 0), EOS ignored, no prompt cache. Time = the server's own prompt + decode timings,
    so HTTP costs nothing; peak RSS is the server process's."""
    rows = []
    for k in [0, *ks]:
        cmd = kit.llama_server_cmd(kit.llamacpp_bin(build=True), 1, k)
        if k:
            cmd += ["--spec-draft-n-min", "0", "-td", str(os.cpu_count() or 1)]
        server, url = kit.start_server(cmd, timeout=300, poll=0.5)
        try:

            def run(ids, length=n, url=url):
                body = {
                    "prompt": ids,
                    "n_predict": length,
                    "temperature": 0.0,
                    "ignore_eos": True,
                    "cache_prompt": False,
                    "return_tokens": True,
                    "seed": 0,
                }
                with kit.post(f"{url}/completion", body, 900) as r:
                    out = json.loads(r.read())
                t = out["timings"]
                return (t["prompt_ms"] + t["predicted_ms"]) / 1000, out

            run(prompts[0]["ids"], length=8)
            for p in prompts:
                runs = [run(p["ids"]) for _ in range(repeats)]
                out = runs[-1][1]
                t = out["timings"]
                rows.append(
                    {
                        "prompt": p["name"],
                        "config": "target-only" if k == 0 else f"k={k}",
                        "tokens_per_s": n / statistics.median(s for s, _ in runs),
                        "token_ids": [int(x) for x in out["tokens"]],
                        "acceptance_rate": (t["draft_n_accepted"] / t["draft_n"]) if t.get("draft_n") else None,
                        "decode_tokens_per_s": t["predicted_per_second"],
                    }
                )
                print(f"llama.cpp k={k} {p['name']}: {rows[-1]['tokens_per_s']:.2f} tok/s", flush=True)
        finally:
            server.terminate()
            _, peak = kit.wait_child(server)
        for r in rows:
            if r["config"] == ("target-only" if k == 0 else f"k={k}"):
                r["server_peak_rss_gib"] = peak
    return rows


def worker_specrt(
    prompts: list[dict], n: int, repeats: int, name: str, profile_x: list[float] | None = None
) -> tuple[list[dict], dict]:
    import specrt
    from specrt.bench import run_bench
    from specrt.prompts import Prompt

    target, drafters, ks = SPECRT[name]
    bundles = {"target": BUNDLES[f"target-{target}"], "draft": BUNDLES["draft-int4"]}
    with tempfile.TemporaryDirectory(prefix="specrt-busy-") as tmp:
        if profile_x:  # profiles as a busy machine's export leaves them (module docstring)
            from busy_bundles import scaled_copy

            factors = dict(zip(bundles, profile_x, strict=True))
            bundles = {role: scaled_copy(path, factors[role], Path(tmp) / role) for role, path in bundles.items()}
        draft = bundles["draft"] if "model" in drafters else None
        engine = specrt.load(bundles["target"], draft, ngram="ngram" in drafters)
        plist = [Prompt(p["name"], p["text"], p["chat"], p["kind"]) for p in prompts]
        result = run_bench(engine, plist, ks, n, repeats, warmup=1, log=lambda s: print(s, flush=True))
        engine.reset()  # waits out an idle moment's measuring, which would store profiles into the copies
    rows = []
    for r in result.rows:
        row = {k: v for k, v in r.__dict__.items() if k not in ("runs_tokens_per_s",)}
        rows.append(row)
    return rows, result.step_ms


# ---------------------------------------------------------------- orchestration and report


def run_worker(config: str, args, prompts_file: Path) -> dict:
    """Run one configuration in a child process (OpenVINO's under its own venv); return its rows plus its own
    peak RSS."""
    out = args.out / "raw" / f"{config}.json"
    cmd = [
        str(ov.PYTHON) if config in ov.PEER_TARGETS else sys.executable,
        __file__,
        "--worker",
        config,
        "--prompts-json",
        str(prompts_file),
        "--raw",
        str(out),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--repeats",
        str(args.repeats),
        "--slow-repeats",
        str(args.slow_repeats),
        *(["--profile-x", *map(str, args.profile_x)] if args.profile_x and config.startswith("specrt") else []),
    ]
    print(f"\n=== {config}", flush=True)
    t0 = time.perf_counter()
    code, peak = kit.wait_child(subprocess.Popen(cmd))
    if code != 0:
        return {"config": config, "error": f"exit {code}"}
    data = json.loads(out.read_text())
    data["peak_rss_gib"] = peak
    data["wall_s"] = time.perf_counter() - t0
    return data


def reused(config: str, args, prompts: list[dict]) -> dict:
    """An earlier run's measurements of one configuration, checked to be of the same prompts and length."""
    raw = args.out / "raw" / f"{config}.json"
    if not raw.is_file():
        sys.exit(f"--reuse {config}: {raw} does not exist; run that configuration first (drop it from --reuse)")
    data = json.loads(raw.read_text())
    got = {(r["prompt"], len(r.get("token_ids", ()))) for r in data.get("rows", [])}
    want = {(p["name"], args.max_new_tokens) for p in prompts}
    if not want <= got:
        sys.exit(f"--reuse {config}: {raw} was measured on other prompts or lengths; run it again")
    if "peak_rss_gib" not in data:  # the earlier run's results.json has the RSS of its children
        try:
            old = json.loads((args.out / "results.json").read_text())["results"]
            data.update({k: v for r in old if r["config"] == config for k, v in r.items() if k != "rows"})
        except (OSError, KeyError, ValueError):
            pass
    data["reused_from"] = time.strftime("%Y-%m-%d %H:%M", time.localtime(raw.stat().st_mtime))
    print(f"\n=== {config}: reused, measured {data['reused_from']}", flush=True)
    return data


def prompt_set(path: Path | None) -> list[dict]:
    import specrt
    from specrt.prompts import DEFAULT_PROMPTS, load_prompts

    prompts = load_prompts(path) if path else list(DEFAULT_PROMPTS)
    tok = specrt.open_bundle(BUNDLES["target-int4"]).load_tokenizer()
    return [
        {
            "name": p.name,
            "text": p.text,
            "chat": p.chat,
            "kind": p.kind,
            "ids": tok.encode_chat(p.text) if p.chat else tok.encode(p.text),
        }
        for p in prompts
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=kit.ROOT / "results")
    parser.add_argument("--prompts", type=Path, default=None, help="JSON lines (see specrt bench)")
    parser.add_argument("--only", nargs="*", choices=CONFIGS, default=None)
    parser.add_argument(
        "--reuse",
        nargs="*",
        choices=CONFIGS,
        default=[],
        help="take these configurations from an earlier run's --out/raw/ instead of running them",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per prompt for the fast configurations")
    parser.add_argument("--slow-repeats", type=int, default=1, help="timed runs per prompt for transformers")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite results.md/png from the measurements already in --out/results.json (no new runs)",
    )
    parser.add_argument(
        "--profile-x",
        nargs=2,
        type=float,
        metavar=("TARGET_X", "DRAFT_X"),
        default=None,
        help="specrt on bundles whose stored profiles are this many times too slow (a busy machine's export)",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prompts-json", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--raw", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:  # child process: one configuration
        prompts = json.loads(args.prompts_json.read_text())
        n, result = args.max_new_tokens, {"config": args.worker}
        if args.worker.startswith("transformers"):
            result["rows"] = worker_transformers(prompts, n, args.slow_repeats, args.worker.endswith("assisted"))
        elif args.worker == "genai-int4":
            result["rows"] = worker_genai(prompts, n, args.repeats, [3, 5])
        elif args.worker == "llamacpp":
            result["rows"] = worker_llamacpp(prompts, n, args.repeats, LLAMACPP_KS)
        elif args.worker in ov.PEER_TARGETS:
            result["rows"] = ov.worker_peers(args.worker, prompts, n, args.repeats)
        else:
            result["rows"], result["step_ms"] = worker_specrt(prompts, n, args.repeats, args.worker, args.profile_x)
        result["peak_rss_gib"] = kit.peak_rss_gib()  # the child's own, kept in its raw file (so --reuse has it)
        args.raw.parent.mkdir(parents=True, exist_ok=True)
        args.raw.write_text(json.dumps(result))
        return 0

    from bench_report import write_report  # noqa: E402  (scripts/ sibling)

    if args.report_only:  # same measurements, same command; only the analysis is recomputed
        saved = json.loads((args.out / "results.json").read_text())
        n = saved.get("max_new_tokens", args.max_new_tokens)
        write_report(saved["results"], saved["prompts"], args.out, saved["command"], n)
        print((args.out / "results.md").read_text())
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    configs = args.only or CONFIGS
    if any(c.startswith(("transformers", "genai")) for c in configs):
        prepare_hf_folders()
    if "genai-int4" in configs and not prepare_genai():
        configs = [c for c in configs if c != "genai-int4"]
    if any(c in ov.PEER_TARGETS for c in configs if c not in args.reuse):
        ov.prepare()
    prompts = prompt_set(args.prompts)
    prompts_file = args.out / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    results = [reused(c, args, prompts) if c in args.reuse else run_worker(c, args, prompts_file) for c in configs]
    command = kit.command_line()
    write_report(results, prompts, args.out, command, args.max_new_tokens)
    print((args.out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
