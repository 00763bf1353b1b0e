#!/usr/bin/env python
"""One run, one JSON: does specrt work on this device, and how fast.

    python scripts/device_check.py --device cuda --out results/gpu/check.json     # on a GPU machine
    python scripts/device_check.py --device cpu --out /tmp/check.json             # here: up to the switch
    python scripts/device_check.py --device cuda --real-target T --real-draft D   # bundles made beforehand

Sections, in order, each recorded with its seconds and either its figures or its error (one failing section
does not stop the others; sections past `--budget` seconds are recorded as skipped):
  machine     Python, onnxruntime and its providers, torch and the GPU's name, specrt's version
  bundles     tiny random checkpoints (a qwen2 target, a noisy copy as draft) exported as fp32 and fp16
              targets and an int4 draft (the real pair too when given)
  parity      each bundle's logits on the device against PyTorch's (on the GPU when torch sees one)
  placement   loading on the device refuses compute nodes placed on the CPU (runtime/providers.py): ok or
              the error
  equality    greedy speculative output (k = 2, 4; batch 1 and 4) equal to target-only on the device, with
              tokens drafted
  steps       t(B, S) of the target on the device, B 1 / 4 / 8, S 1 / 5 (median of --reps)
  transfers   bytes to the host and to the device per round while speculating (only ids should cross)
  speed       tok/s target-only against speculative (k = 3) at batch 1, 4, 8
  tensorrt    whether ONNX Runtime's TensorRT provider is there (specrt does not drive it yet)
docs/gpu.md says how to bring onnxruntime-gpu to a lent machine. Nothing here needs the network.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchkit as kit

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


class Check:
    """The sections' results, in order, within a time budget."""

    def __init__(self, budget: float):
        self.report: dict = {"sections": {}}
        self.deadline = time.monotonic() + budget

    def section(self, name: str, fn) -> None:
        if time.monotonic() > self.deadline:
            self.report["sections"][name] = {"skipped": "past the time budget"}
            return
        t0 = time.perf_counter()
        try:
            got = fn()
            entry = {"ok": True, **(got or {})}
        except Exception as e:  # noqa: BLE001 - recorded: the other sections still run
            entry = {
                "ok": False,
                "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400] if str(e) else ''}",
            }
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        self.report["sections"][name] = entry
        print(f"[device_check] {name}: {'ok' if entry.get('ok') else entry.get('error') or entry}", flush=True)


def machine() -> dict:
    import onnxruntime as ort

    import specrt

    out = {
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
    }
    out["specrt"] = specrt.__version__
    try:
        import torch

        out["torch"] = torch.__version__
        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        out["torch"] = None
    return out


def make_bundles(root: Path) -> dict:
    from specrt.export.pipeline import ExportOptions, export_bundle
    from specrt.export.progress import Progress
    from specrt.export.tiny import make_checkpoint, make_tokenizer

    tok = make_tokenizer(root / "tokenizer")
    target = make_checkpoint(root / "ckpt-target", tok, "qwen2", layers=3)
    draft = make_checkpoint(root / "ckpt-draft", tok, "qwen2", layers=3, noise_from=target, noise=0.05, seed=1)
    made = {}
    for name, ckpt, options in (
        ("target-fp32", target, ExportOptions(max_seq_len=256)),
        ("target-fp16", target, ExportOptions(max_seq_len=256, dtype="fp16")),
        ("draft-int4", draft, ExportOptions(role="draft", max_seq_len=256, quant="int4")),
    ):
        export_bundle(ckpt, root / name, options, Progress(enabled=False))
        made[name] = root / name
    return {
        "bundles": {k: str(v) for k, v in made.items()},
        "checkpoints": {"target": str(target), "draft": str(draft)},
    }


def parity(bundles: dict, checkpoints: dict, options) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from specrt.bundle.loading import open_bundle
    from specrt.runtime.session import ModelSession

    where = "cuda" if torch.cuda.is_available() else "cpu"
    out = {"reference_device": where}
    for name, path in bundles.items():
        ckpt = checkpoints["draft" if name.startswith("draft") else "target"]
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).to(where).eval()
        ids = list(range(5, 29))
        with torch.no_grad():
            ref = model(torch.tensor([ids], device=where)).logits[0].float().cpu().numpy()
        got = ModelSession(open_bundle(path), options).run([0], [ids], [len(ids)])[0]
        out[name] = {
            "max_abs_diff": float(np.abs(got - ref).max()),
            "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).mean()),
        }
    return out


def equality(engine, specrt) -> dict:
    """Greedy speculative output against target-only; where they part (a quantized target rounds a verify pass
    and a 1-token step differently), the target's top-2 margin there must be a near-tie."""
    from specrt.decoding.divergence import NEAR_TIE, divergence

    out, drafted, parted = {}, 0, []
    prompts = [PROMPT, "import os\n", "class A:\n", "for i in range(3):\n"]
    plain = specrt.GenerationOptions(max_new_tokens=24, num_draft_tokens=0)
    base = [engine.complete(p, plain).token_ids for p in prompts]
    for k in (2, 4):
        options = specrt.GenerationOptions(max_new_tokens=24, num_draft_tokens=k)
        runs = {"batch1": [engine.complete(prompts[0], options)], "batch4": _together(engine, prompts, options)}
        for name, gens in runs.items():
            out[f"k{k}_{name}_equal"] = [g.token_ids for g in gens] == base[: len(gens)]
            drafted += sum(g.stats.drafted for g in gens)
            for g, prompt, b in zip(gens, prompts, base, strict=False):
                if g.token_ids != b:
                    parted.append(divergence(engine.target, engine.encode(prompt), b, g.token_ids))
    out["drafted"], out["divergences"] = drafted, parted
    if not drafted or any(d["top2_margin"] >= NEAR_TIE for d in parted):
        raise AssertionError(f"nothing drafted, or output parted from target-only at a clear choice: {out}")
    return out


def _together(engine, prompts: list[str], options) -> list:
    """The prompts' generations, run together (one client thread each), in prompt order."""
    done, _ = kit.run_clients(lambda i: (i, engine.complete(prompts[i], options)), range(len(prompts)), len(prompts))
    return [g for _, g in sorted(done, key=lambda pair: pair[0])]


def steps(path: str, options, reps: int) -> dict:
    from specrt.bundle.loading import open_bundle
    from specrt.runtime.session import ModelSession

    session = ModelSession(open_bundle(path), options, rows=8)
    out = {}
    for rows in (1, 4, 8):
        for width in (1, 5):
            times = []
            for _ in range(reps + 1):
                for r in session.kv.rows[:rows]:
                    r.reset()
                    r.advance([1] * 64)
                t0 = time.perf_counter()
                session.run_logits(list(range(rows)), [[2] * width] * rows, [width] * rows)
                times.append(1000 * (time.perf_counter() - t0))
            out[f"B{rows}_S{width}_ms"] = round(statistics.median(times[1:]), 3)
    return out


def speed(engine, specrt) -> dict:
    out = {}
    for batch in (1, 4, 8):
        for name, k in (("target_only", 0), ("speculative_k3", 3)):
            options = specrt.GenerationOptions(max_new_tokens=48, num_draft_tokens=k, ignore_eos=True)
            before = dict(engine.stats)
            t0 = time.perf_counter()
            _together(engine, [PROMPT + f"# {i}\n" for i in range(batch)], options)
            wall = time.perf_counter() - t0
            rounds = engine.stats["rounds"] - before["rounds"]
            out[f"b{batch}_{name}_tok_s"] = round(batch * 48 / wall, 2)
            if k:
                out[f"b{batch}_bytes_to_host_per_round"] = (
                    engine.stats["bytes_to_host"] - before["bytes_to_host"]
                ) / rounds
                out[f"b{batch}_bytes_to_device_per_round"] = (
                    engine.stats["bytes_to_device"] - before["bytes_to_device"]
                ) / rounds
    return out


def apart(engine, specrt, target: str, draft: str, device: str) -> dict:
    """The draft on the CPU, the target on the device (`draft_device`): greedy output equal to the shared
    engine's target-only output, ids alone crossing between the two; a seeded sampled run crosses the drafted
    positions' q (its tokens against the shared engine's: a figure, as the two devices may round q apart)."""
    split = specrt.load(target, draft, device=device, draft_device="cpu", max_batch=4)
    greedy = specrt.GenerationOptions(max_new_tokens=24, num_draft_tokens=3)
    plain = specrt.GenerationOptions(max_new_tokens=24, num_draft_tokens=0)
    sampled = specrt.GenerationOptions(max_new_tokens=24, num_draft_tokens=3, temperature=0.8, top_k=40, seed=3)
    g = split.complete(PROMPT, greedy)
    out = {"greedy_equal": g.token_ids == engine.complete(PROMPT, plain).token_ids, "drafted": g.stats.drafted}
    out["greedy_bytes_across"] = split.stats["bytes_across_devices"]
    s = split.complete(PROMPT, sampled)
    out["sampled_equal_to_shared"] = s.token_ids == engine.complete(PROMPT, sampled).token_ids
    out["sampled_bytes_across_per_drafted"] = (split.stats["bytes_across_devices"] - out["greedy_bytes_across"]) / max(
        s.stats.drafted, 1
    )
    if not (out["greedy_equal"] and out["drafted"] and out["greedy_bytes_across"] == 0):
        raise AssertionError(f"a draft apart parted from target-only, drafted nothing, or crossed more than ids: {out}")
    return out


def check_pair(check: Check, label: str, target: str, draft: str, args, options) -> None:
    """Load the pair on the device (the placement check), then equality, step times and speed."""
    import specrt

    engine: list = []

    def load() -> dict:
        engine.append(specrt.load(target, draft, device=args.device, max_batch=8))
        return {"sampler": engine[0].decider.name}

    check.section(f"placement_{label}", load)
    if engine:
        check.section(f"equality_{label}", lambda: equality(engine[0], specrt))
        check.section(f"steps_{label}", lambda: steps(target, options, args.reps))
        check.section(f"speed_{label}", lambda: speed(engine[0], specrt))
        check.section(f"apart_{label}", lambda: apart(engine[0], specrt, target, draft, args.device))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=None, help="where the tiny bundles go [default: a temporary folder]")
    p.add_argument("--real-target", type=Path, default=None)
    p.add_argument("--real-draft", type=Path, default=None)
    p.add_argument("--budget", type=float, default=420.0, help="seconds; later sections are skipped past it")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from specrt.runtime.providers import parse_device
    from specrt.runtime.session import SessionOptions

    name, device_id = parse_device(args.device)
    options = SessionOptions(device=name, device_id=device_id)
    check = Check(args.budget)
    check.report["device"] = args.device
    check.section("machine", machine)
    work = args.work or Path(tempfile.mkdtemp(prefix="specrt-device-check-"))
    made: dict = {}
    check.section("bundles", lambda: made.update(make_bundles(work)) or {"where": str(work)})
    bundles = dict(made.get("bundles", {}))
    pairs = [("tiny", bundles.get("target-fp32"), bundles.get("draft-int4"))]
    if args.real_target and args.real_draft:
        pairs.append(("real", str(args.real_target), str(args.real_draft)))
    if bundles:
        check.section("parity", lambda: parity(bundles, made["checkpoints"], options))
    for label, target, draft in pairs:
        if target:
            check_pair(check, label, target, draft, args, options)
    import onnxruntime as ort

    check.section("tensorrt", lambda: {"provider": "TensorrtExecutionProvider" in ort.get_available_providers()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(check.report, indent=1))
    failed = [k for k, v in check.report["sections"].items() if v.get("ok") is False]
    print(f"[device_check] {args.out}: {len(check.report['sections'])} sections, failed: {failed or 'none'}")


if __name__ == "__main__":
    main()
