#!/usr/bin/env python
"""The OpenVINO GenAI benchmark peer: its environment (a venv of its own and the int4 IRs it runs, made once and
cached outside the repository), its pipelines, and the workers that scripts/bench_peers.py (single stream) and
scripts/bench_batch.py (continuous batching) run under that venv's interpreter.

    .venv/bin/python scripts/peer_openvino.py prepare     # once: about 6 minutes on 2 cores, plus downloads

Cached in ${XDG_CACHE_HOME:-~/.cache}/specrt/openvino-2026.4/ (SPECRT_OPENVINO_DIR overrides): venv/ (openvino,
openvino-tokenizers and openvino-genai for running; optimum-intel, nncf, torch and transformers only for
converting) and ir/<gguf stem>-<sha256 prefix>-int4/ (`optimum-cli export openvino --weight-format int4` of the
Hugging Face folder that bench_peers makes from that GGUF: optimum's default int4_asym in groups of 128, the
embedding and lm_head int8 per channel; with the OpenVINO tokenizer and detokenizer models it writes). torch
must resolve to a CPU build (`torch==2.13.0` does through our wheel cache; elsewhere install it into the venv
from the PyTorch CPU index first).

Two targets: `openvino-gguf` reads the GGUF target itself (OpenVINO GenAI's GGUF reader, about 20 s per load
and 1 GiB more peak RSS than the IR; it loads the 1.5B Q4_K_M file but not the 0.5B draft's Q5_0 tensors, so
the draft is always the int4 IR) and `openvino-ir` runs the int4 IR of the target. Everything else is
OpenVINO's CPU defaults, which differ from the other peers': bf16 activations where the CPU has AVX512-BF16
(INFERENCE_PRECISION_HINT; f32 on CPUs without it), a u8 key/value cache, dynamic quantization of activations
in groups of 32 for the int4 matmuls, and paged attention in LLMPipeline too (so target-only and speculative
rows share their kernels); INFERENCE_NUM_THREADS = all cores, as the other peers use.

Only the standard library is imported at the top: the parent scripts import this module under the project's
.venv (to prepare and to launch workers), the workers run it under the OpenVINO venv (no specrt there, so the
prompts' token ids come from the parent's JSON file).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchkit as kit

VERSION = "2026.4.1"
CACHE = Path(
    os.environ.get("SPECRT_OPENVINO_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specrt/openvino-2026.4"
)
VENV = CACHE / "venv"
PYTHON = VENV / "bin/python"
RUNTIME_PACKAGES = [f"openvino=={VERSION}", f"openvino-tokenizers=={VERSION}.0", f"openvino-genai=={VERSION}.0"]
CONVERT_PACKAGES = ["optimum-intel==2.2.0", "nncf==3.4.0", "torch==2.13.0"]
HF = {role: kit.ROOT / "models/hf" / path.stem for role, path in kit.GGUF.items()}  # as bench_peers makes them


# ---------------------------------------------------------------- environment (once, cached outside the repo)


def _sha256_prefix(path: Path) -> str:
    """The first 12 hex digits of a file's sha256, memoized per (path, size, mtime) in the cache: hashing the
    1.5B GGUF takes seconds and every run asks."""
    memo_file = CACHE / "sha256.json"
    memo = json.loads(memo_file.read_text()) if memo_file.is_file() else {}
    st = path.stat()
    key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    if key not in memo:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        memo[key] = digest.hexdigest()[:12]
        CACHE.mkdir(parents=True, exist_ok=True)
        memo_file.write_text(json.dumps(memo, indent=1))
    return memo[key]


def ir_dir(role: str) -> Path:
    """Where the int4 IR of the role's GGUF lives (keyed by the GGUF's content)."""
    gguf = kit.GGUF[role]
    return CACHE / "ir" / f"{gguf.stem}-{_sha256_prefix(gguf)}-int4"


def _ir_done(path: Path) -> bool:
    names = ("openvino_model.xml", "openvino_tokenizer.xml", "openvino_detokenizer.xml")
    return all((path / name).is_file() for name in names)


def _pip(args: list[str], what: str) -> None:
    """pip install into the venv; its chatter goes to a log, a failure ends the run with one line."""
    log = CACHE / "pip.log"
    with log.open("a") as f:
        cmd = [str(PYTHON), "-m", "pip", "install", *args]
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        sys.exit(f"error: pip could not install {what} into {VENV} (see {log}); check that PyPI is reachable")


def prepare() -> None:
    """The venv, the HF folders the converter reads, and the int4 IRs of target and draft; each step skipped
    when its result exists."""
    t0 = time.perf_counter()
    for gguf in kit.GGUF.values():
        if not gguf.is_file():
            sys.exit(f"error: {gguf} is missing: run .venv/bin/python scripts/fetch_models.py")
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (VENV / ".complete").exists():
        kit.log(f"making the OpenVINO venv {VENV} (openvino-genai {VERSION}, optimum-intel, nncf, torch CPU)")
        if not PYTHON.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        _pip(["--upgrade", "pip"], "pip")
        _pip([*RUNTIME_PACKAGES, *CONVERT_PACKAGES], "openvino-genai and optimum-intel")
        # optimum-intel requires torchvision, and the wheel that resolves next to a CPU torch is a CUDA build
        # whose ops fail to load, which breaks `import transformers`; converting a text model never uses it.
        subprocess.run([str(PYTHON), "-m", "pip", "uninstall", "-q", "-y", "torchvision"], check=True)
        (VENV / ".complete").touch()
    missing = [role for role in ("target", "draft") if not _ir_done(ir_dir(role))]
    if missing and not all((HF[role] / "config.json").exists() for role in missing):
        import bench_peers  # its HF folders from the GGUFs (transformers, under the project's .venv)

        bench_peers.prepare_hf_folders()
    for role in missing:
        out = ir_dir(role)
        kit.log(f"converting {HF[role].name} to int4 IR in {out} (optimum-cli export openvino)")
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [str(VENV / "bin/optimum-cli"), "export", "openvino", "--model", str(HF[role])]
        cmd += ["--task", "text-generation-with-past", "--weight-format", "int4", str(tmp)]
        started = time.perf_counter()
        if subprocess.run(cmd).returncode != 0 or not _ir_done(tmp):
            sys.exit(f"error: optimum-cli could not convert {HF[role]} to {tmp}; see its output above")
        tmp.rename(out)
        kit.log(f"  done in {time.perf_counter() - started:.0f} s")
    kit.log(f"OpenVINO peer ready in {CACHE} ({time.perf_counter() - t0:.0f} s)")


# ---------------------------------------------------------------- pipelines (under the OpenVINO venv)

# bench_peers configurations: name -> the target the pipelines read
PEER_TARGETS = {"openvino-gguf": "gguf", "openvino-ir": "ir"}
# Single-stream modes, in the order run: name -> (pipeline kind, GenerationConfig fields). The draft pipeline
# serves the fixed-k and the dynamic rows, the prompt-lookup pipeline both of its rows.
PEER_MODES = {
    "target-only": ("plain", {}),
    "k=3": ("draft", {"num_assistant_tokens": 3}),
    "k=5": ("draft", {"num_assistant_tokens": 5}),
    "dynamic 0.4": ("draft", {"assistant_confidence_threshold": 0.4}),
    "lookup k=3": ("lookup", {"num_assistant_tokens": 3, "max_ngram_size": 3}),
    "lookup k=5": ("lookup", {"num_assistant_tokens": 5, "max_ngram_size": 3}),
}


def _target_path(target: str) -> str:
    """The GGUF file itself (OpenVINO GenAI converts it at load, about 20 s) or the IR folder."""
    return str(kit.GGUF["target"] if target == "gguf" else ir_dir("target"))


def _properties() -> dict:
    return {"INFERENCE_NUM_THREADS": os.cpu_count() or 1}


def pipeline(target: str, kind: str):
    """An LLMPipeline on the target ("gguf" or "ir"): alone (kind "plain"), with the int4 draft IR ("draft"),
    or with prompt lookup ("lookup")."""
    import openvino_genai as ov_genai

    extra = {}
    if kind == "draft":
        extra["draft_model"] = ov_genai.draft_model(str(ir_dir("draft")), "CPU", **_properties())
    elif kind == "lookup":
        extra["prompt_lookup"] = True
    return ov_genai.LLMPipeline(_target_path(target), "CPU", **_properties(), **extra)


def generation_config(n: int, fields: dict, temperature: float = 0.0, seed: int = 0):
    """n new tokens, EOS ignored (and masked for the first n, as transformers' min_new_tokens does), greedy or
    sampled at `temperature`. A fresh config, not the model's: the IR's generation_config.json must not bring
    a repetition penalty or sampling defaults into the greedy rows."""
    import openvino_genai as ov_genai

    config = ov_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = n
    config.ignore_eos = True
    if temperature > 0:
        config.do_sample, config.temperature, config.rng_seed = True, temperature, seed
    for key, value in fields.items():
        setattr(config, key, value)
    return config


def _input_ids(ids: list[int]):
    import numpy as np
    import openvino as ov

    return ov.Tensor(np.array([ids], dtype=np.int64))


# ---------------------------------------------------------------- bench_peers: single stream


def worker_peers(name: str, prompts: list[dict], n: int, repeats: int) -> list[dict]:
    """Every mode of PEER_MODES on one target, prompt by prompt (same token ids as the other peers): tokens/s
    end to end (median over repeats), the generated ids, OpenVINO's own acceptance rate, and whether the
    output equals this target's own target-only output."""
    target, rows, pipe, kind_loaded = PEER_TARGETS[name], [], None, None
    for mode, (kind, fields) in PEER_MODES.items():
        if kind != kind_loaded:
            pipe = run = None  # the previous pipeline's memory is freed before the next loads
            t0 = time.perf_counter()
            pipe, kind_loaded = pipeline(target, kind), kind
            print(f"{name} {kind} pipeline loaded in {time.perf_counter() - t0:.1f} s", flush=True)

        def run(ids, length=n, fields=fields, pipe=pipe):
            t0 = time.perf_counter()
            result = pipe.generate(_input_ids(ids), generation_config(length, fields))
            return time.perf_counter() - t0, result

        run(prompts[0]["ids"], length=8)  # first runs compile the kernels for this pipeline's shapes
        for p in prompts:
            runs = [run(p["ids"]) for _ in range(repeats)]
            result = runs[-1][1]
            extended = result.extended_perf_metrics  # draft-model pipelines only (prompt lookup has none)
            rows.append(
                {
                    "prompt": p["name"],
                    "config": mode,
                    "tokens_per_s": n / statistics.median(s for s, _ in runs),
                    "token_ids": [int(t) for t in result.tokens[0]],
                    "acceptance_rate": extended.get_draft_acceptance_rate() if extended is not None else None,
                    "ttft_s": result.perf_metrics.get_ttft().mean / 1000,
                }
            )
            print(f"{name} {mode} {p['name']}: {rows[-1]['tokens_per_s']:.2f} tok/s", flush=True)
    alone = {r["prompt"]: r["token_ids"] for r in rows if r["config"] == "target-only"}
    for r in rows:
        if r["config"] != "target-only":
            ref = alone[r["prompt"]]
            r["equal_to_target_only"] = r["token_ids"] == ref
            r["first_difference"] = next(
                (i for i, (a, b) in enumerate(zip(r["token_ids"], ref, strict=False)) if a != b),
                None if len(r["token_ids"]) == len(ref) else min(len(ref), len(r["token_ids"])),
            )
    return rows


# ---------------------------------------------------------------- bench_batch: continuous batching

# bench_batch configurations: name -> draft tokens per round (0: the target alone)
BATCH_CONFIGS = {"openvino": 0, "openvino + draft k=3": 3}
BATCH_TARGETS = {"gguf": "OpenVINO GGUF Q4_K_M", "ir": "OpenVINO int4 IR"}  # the report's target column


def batch_pipeline(target: str, draft_k: int):
    """OpenVINO GenAI's ContinuousBatchingPipeline on the target, with the int4 draft IR when draft_k; its
    default SchedulerConfig (KV cache blocks allocated as needed, 256 batched tokens per step)."""
    import openvino_genai as ov_genai

    properties = _properties()
    if draft_k:
        properties["draft_model"] = ov_genai.draft_model(str(ir_dir("draft")), "CPU", **_properties())
    return ov_genai.ContinuousBatchingPipeline(_target_path(target), ov_genai.SchedulerConfig(), "CPU", properties)


def batch_level(pipe, prompts: list[list[int]], concurrency: int, temperature: float, draft_k: int, n: int):
    """One level: the prompts as requests, at most `concurrency` in flight, the next added as soon as one ends
    (as bench_batch's client threads do), the pipeline stepped from this thread. Request i is sampled with
    seed i. Returns per request {ttft, s, tokens} and the wall time."""
    import openvino_genai as ov_genai

    fields = {"num_assistant_tokens": draft_k} if draft_k else {}
    queue, active, results = list(enumerate(prompts)), {}, []
    start = time.perf_counter()
    while queue or active:
        while queue and len(active) < concurrency:
            i, ids = queue.pop(0)
            config = generation_config(n, fields, temperature, seed=i)
            active[i] = {"handle": pipe.add_request(i, _input_ids(ids), config), "t0": time.perf_counter()}
            active[i] |= {"first": None, "tokens": 0}
        pipe.step()
        now = time.perf_counter()
        for i, req in list(active.items()):
            handle = req["handle"]
            if handle.can_read():
                got = sum(len(out.generated_ids) for out in handle.read().values())
                if got and req["first"] is None:
                    req["first"] = now
                req["tokens"] += got
            status = handle.get_status()
            if status == ov_genai.GenerationStatus.RUNNING or handle.can_read():
                continue
            if status != ov_genai.GenerationStatus.FINISHED:
                raise RuntimeError(f"OpenVINO request {i} ended {status.name}, not FINISHED")
            results.append({"ttft": (req["first"] or now) - req["t0"], "s": now - req["t0"], "tokens": req["tokens"]})
            del active[i]
    return results, time.perf_counter() - start


def worker_batch(target: str, config: str, levels: list[int], temperatures: list[float], prompts, n, summary):
    """bench_batch rows of one configuration (one pipeline for every level): at each level an untimed round of
    c short requests first (OpenVINO compiles its kernels for new shapes on their first run), then 2 x c
    requests per temperature. `summary(results, wall)` makes the row's numbers, as for llama-server."""
    draft_k = BATCH_CONFIGS[config]
    t0 = time.perf_counter()
    pipe = batch_pipeline(target, draft_k)
    kit.log(f"OpenVINO {target} {config}: pipeline loaded in {time.perf_counter() - t0:.1f} s")
    rows = []
    for c in levels:
        batch_level(pipe, prompts[:c], c, 0.0, draft_k, 8)
        for temperature in temperatures:
            kit.log(f"OpenVINO {target} {config} c={c} T={temperature}")
            row = summary(*batch_level(pipe, prompts[: 2 * c], c, temperature, draft_k, n))
            where = {"target": BATCH_TARGETS[target], "concurrency": c, "temperature": temperature, "config": config}
            rows.append(where | row)
            kit.log(f"  {row['total_tokens_per_s']:.1f} tok/s total, ttft p50 {row['ttft_p50_s']:.2f} s")
    return rows


if __name__ == "__main__":
    if sys.argv[1:] != ["prepare"]:
        sys.exit("usage: python scripts/peer_openvino.py prepare")
    prepare()
