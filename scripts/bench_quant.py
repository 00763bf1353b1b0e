#!/usr/bin/env python
"""Kernel and block choices, measured on the real pair: speed and fidelity of each weight format, per role.

    python scripts/bench_quant.py --out results/quant            # both roles (about 45 minutes on 2 cores)
    python scripts/bench_quant.py --role draft --out results/quant

For the 1.5B target and the 0.5B draft, each variant (int4 block 32/64/128/256, symmetric or with zero
points, accuracy level 1 or 4, LM head int4/int8/fp32, int8, and the GGUF-native bundle) is exported once
from the GGUF into engines/variants/ (accuracy-level-1 twins share the weights file and differ only in the
graph's attributes), then measured against the fp32 bundle of the same GGUF:

- speed: one forward of S new tokens after a 512-token context (S = 1, 2, 3, 5, 9 for the target: plain
  steps and verify passes; S = 1, 2 for the draft), median of interleaved repeats. Each variant is timed in
  alternation with the same baseline (int4 block 32, today's default) so that drift on a shared machine
  cancels in the ratio t(variant) / t(baseline), which the tables report beside the absolute times;
- fidelity on real text: the eight benchmark prompts, each followed by the fp32 target's own greedy
  128-token continuation, teacher-forced through the variant: max |logit difference| from the fp32 bundle
  and top-1 agreement over those 1,024 positions; then greedy decoding of 128 tokens: on how many prompts
  the output equals the fp32 bundle's, and where the first difference falls. Draft variants are also
  scored against the target's tokens (top-1 agreement with the fp32 target's greedy continuation: the
  acceptance a greedy round would see at each position).

Writes <out>/<role>.json, <out>/quant.md (both tables) and <out>/quant.png (speed against fidelity).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import benchkit as kit
import numpy as np

VARIANTS_DIR = kit.ROOT / "engines/variants"
CONTEXT = 512
WIDTHS = {"target": [1, 2, 3, 5, 9], "draft": [1, 2]}
BASELINE = "int4-b32"
# name -> export flags (None: derived from another variant by changing the accuracy level only)
TARGET_VARIANTS = {
    "int4-b32": ["--quant", "int4", "--block-size", "32"],
    "int4-b64": ["--quant", "int4", "--block-size", "64"],
    "int4-b128": ["--quant", "int4", "--block-size", "128"],
    "int4-b256": ["--quant", "int4", "--block-size", "256"],
    "int4-b32-asym": ["--quant", "int4", "--block-size", "32", "--asymmetric"],
    "int4-b128-asym": ["--quant", "int4", "--block-size", "128", "--asymmetric"],
    "int4-b128-head-int8": ["--quant", "int4", "--block-size", "128", "--lm-head", "int8"],
    "int4-b128-head-fp32": ["--quant", "int4", "--block-size", "128", "--lm-head", "fp32"],
    "int8-b32": ["--quant", "int8", "--block-size", "32"],
    "native": ["--quant", "native"],
    "native-head-fp32": ["--quant", "native", "--lm-head", "fp32"],
    # the first native form: zero point 0 in every Q4_K block, the whole offset in the correction
    "native-zp0": None,
    "int4-b32-acc1": None,
    "int4-b128-acc1": None,
    "native-acc1": None,
}
DRAFT_VARIANTS = ("int4-b32", "int4-b64", "int4-b128", "int4-b256", "int4-b128-asym", "int4-b128-head-int8")
DRAFT_VARIANTS += ("int8-b32", "native", "int4-b128-acc1")  # a subset of the target's, with the same flags
VARIANTS = {"target": TARGET_VARIANTS, "draft": {name: TARGET_VARIANTS[name] for name in DRAFT_VARIANTS}}


# ---------------------------------------------------------------- building the variants (cached)


def reference_bundle(role: str) -> Path:
    """The fp32 bundle of the role's GGUF: the fidelity reference (the GGUF's weights, fp32 arithmetic)."""
    demo = kit.ROOT / "engines/qwen2.5-coder-1.5b-fp32"
    if role == "target" and (demo / "manifest.json").exists():
        return demo
    return export(role, "fp32", ["--quant", "none", "--lm-head", "fp32"])


def export(role: str, name: str, flags: list[str]) -> Path:
    return kit.export_bundle(role, VARIANTS_DIR / f"{role}-{name}", flags, f"{role} {name} ({' '.join(flags)})")


def with_accuracy_level(src: Path, dst: Path, level: int) -> Path:
    """A twin of `src` whose MatMulNBits nodes run at another accuracy level: same weights file (hard link),
    graph attributes changed, manifest updated (its file records included)."""
    import onnx

    from specrt.bundle.integrity import record

    if (dst / "manifest.json").exists():
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((src / "manifest.json").read_text())
    for f in manifest["files"]:
        if f["kind"] == "weights":
            (dst / f["name"]).unlink(missing_ok=True)
            os.link(src / f["name"], dst / f["name"])
        elif f["kind"] != "graph":
            shutil.copy(src / f["name"], dst / f["name"])
    model = onnx.load(str(src / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = level
    onnx.save(model, str(dst / "model.onnx"))
    manifest["quantization"]["accuracy_level"] = level
    manifest["files"] = [
        record(dst, f["name"], f["kind"]).__dict__ if f["kind"] == "graph" else f for f in manifest["files"]
    ]
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dst


def build(role: str) -> dict[str, Path]:
    out = {}
    for name, flags in VARIANTS[role].items():
        if flags is not None:
            out[name] = export(role, name, flags)
    for name, flags in VARIANTS[role].items():
        if name == "native-zp0":  # kept from an earlier export (the exporter now writes the centred form)
            if (VARIANTS_DIR / f"{role}-{name}" / "manifest.json").exists():
                out[name] = VARIANTS_DIR / f"{role}-{name}"
        elif flags is None:
            base = name.removesuffix("-acc1")
            out[name] = with_accuracy_level(out[base], VARIANTS_DIR / f"{role}-{name}", 1)
    return out


# ---------------------------------------------------------------- measuring


def speed(variant, baseline, widths: list[int], reps: int) -> dict:
    """Median t(S) of the variant and of the baseline, timed alternately (ABBA) in the same window."""
    times = {(who, w): [] for who in ("v", "b") for w in widths}
    for rep in range(reps + 1):
        for who, session in kit.interleave([("b", baseline), ("v", variant)], rep):
            for w in widths:
                t = kit.timed_forward(session, CONTEXT, w, keep=w)
                if rep:  # the first round warms up
                    times[who, w].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "ms": {w: med["v", w] for w in widths},
        "baseline_ms": {w: med["b", w] for w in widths},
        "vs_baseline": {w: med["v", w] / med["b", w] for w in widths},
        "verify_ratio": {w: med["v", w] / med["v", 1] for w in widths},
    }


def reference_texts(role_ref: Path, prompts, n: int) -> list[dict]:
    """Per prompt: its token ids, the fp32 target's greedy continuation and the fp32 logits over it."""
    import specrt

    engine = specrt.load(role_ref)
    out = []
    for p in prompts:
        ids = engine.encode(p.text, chat=p.chat)
        gen = engine.complete(ids, specrt.GenerationOptions(max_new_tokens=n, num_draft_tokens=0, ignore_eos=True))
        out.append({"name": p.name, "ids": ids, "continuation": gen.token_ids})
    return out


def forced_logits(session, ids: list[int], cont: list[int]) -> np.ndarray:
    session.kv.rows[0].reset()
    logits = session.forward(ids + cont[:-1], keep=len(cont)).copy()
    session.kv.rows[0].reset()
    return logits


def fidelity(engine, reference, texts: list[dict], greedy: bool) -> dict:
    """Teacher-forced logit differences and top-1 agreement with the reference; greedy agreement."""
    import specrt

    diffs, agree, same, first = [], [], 0, []
    for t in texts:
        mine = forced_logits(engine.target, t["ids"], t["continuation"])
        ref = forced_logits(reference, t["ids"], t["continuation"])
        diffs.append(float(np.abs(mine - ref).max()))
        agree += list(mine.argmax(-1) == ref.argmax(-1))
    out = {"max_abs_logit_diff": max(diffs), "top1_agreement": float(np.mean(agree))}
    if greedy:  # plain decoding (k = 0) through the generate loop
        for t in texts:
            n = len(t["continuation"])
            engine.reset()
            got = engine.complete(
                t["ids"], specrt.GenerationOptions(max_new_tokens=n, num_draft_tokens=0, ignore_eos=True)
            )
            same += got.token_ids == t["continuation"]
            pairs = zip(got.token_ids, t["continuation"], strict=False)
            first.append(next((i for i, (a, b) in enumerate(pairs) if a != b), None))
        out.update(greedy_equal=same, greedy_prompts=len(texts), first_differences=first)
    return out


def target_agreement(draft, texts: list[dict]) -> float:
    """How often the draft's argmax is the target's next greedy token (teacher-forced on the target's text)."""
    hits = []
    for t in texts:
        mine = forced_logits(draft, t["ids"], t["continuation"])
        hits += list(mine.argmax(-1) == np.array(t["continuation"]))
    return float(np.mean(hits))


def measure_role(role: str, reps: int, texts: list[dict], saved: Path, fresh: bool, speed_only: bool) -> dict:
    from specrt.bundle.loading import open_bundle
    from specrt.engine.api import Engine
    from specrt.runtime.session import ModelSession, SessionOptions

    bundles = build(role)
    options = SessionOptions(spin_between_runs=False)  # as beside a draft model
    ref_path = reference_bundle(role)
    reference = ModelSession(open_bundle(ref_path), options)
    baseline = Engine(bundles[BASELINE], session_options=options)
    result = {"role": role, "reference": str(ref_path.relative_to(kit.ROOT)), "context": CONTEXT, "rows": {}}
    if saved.exists() and not fresh:  # variants measured by an earlier (interrupted) run are kept
        result["rows"] = json.loads(saved.read_text()).get("rows", {})
    rows = result["rows"]
    for name, path in bundles.items():
        if name in rows and speed_only:  # fidelity is deterministic; speed is re-measured on a quiet machine
            kit.log(f"{role} {name}: speed again")
            engine = baseline if name == BASELINE else Engine(path, session_options=options)
            rows[name].update(speed(engine.target, baseline.target, WIDTHS[role], reps))
            rows[name]["speed_measured"] = time.strftime("%Y-%m-%d %H:%M")
            kit.write_json(saved, result)
            del engine
            continue
        if name in rows:
            kit.log(f"{role} {name}: measured before, kept")
            continue
        kit.log(f"{role} {name}: speed and fidelity")
        engine = baseline if name == BASELINE else Engine(path, session_options=options)
        row = {"bundle": str(path.relative_to(kit.ROOT)), "size_mib": (path / "model.onnx.data").stat().st_size / 2**20}
        row.update(speed(engine.target, baseline.target, WIDTHS[role], reps))
        # Greedy decoding is skipped for accuracy level 1 twins (same weights as their level-4 twin; level-1
        # 8-bit kernels run at a fraction of the speed, so 1,024 greedy steps would take many minutes).
        row.update(fidelity(engine, reference, texts, greedy=role == "target" and not name.endswith("-acc1")))
        if role == "draft":
            row["target_agreement"] = target_agreement(engine.target, texts)
        m = engine.target.bundle.manifest.quantization
        row["quantization"] = {k: v for k, v in m.__dict__.items() if k != "tensors"}
        if m.tensors:
            exact = sum("NOT exact" not in v for v in m.tensors.values())
            row["exact_tensors"] = f"{exact}/{len(m.tensors)}"
        row["measured"] = time.strftime("%Y-%m-%d %H:%M")
        rows[name] = row
        kit.write_json(saved, result)
        kit.log(
            f"  t(1) {row['ms'][1]:.1f} ms ({row['vs_baseline'][1]:.2f}x baseline), top-1 {row['top1_agreement']:.3f}"
        )
        del engine
    return result


# ---------------------------------------------------------------- report


def table(result: dict) -> list[str]:
    role, rows = result["role"], result["rows"]
    widths = WIDTHS[role]
    head = ["variant", "weights MiB", "t(1) ms", "t(1) / int4-b32"]
    head += [f"t({w})/t(1)" for w in widths[1:]]
    head += ["max abs logit diff", "top-1 vs fp32"]
    head += ["greedy = fp32 (of 8)", "first differences"] if role == "target" else ["top-1 = target's token"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, r in rows.items():
        ms, vs, ratio = ({int(k): v for k, v in r[key].items()} for key in ("ms", "vs_baseline", "verify_ratio"))
        cells = [name, f"{r['size_mib']:.0f}", f"{ms[1]:.1f}", f"{vs[1]:.2f}"]
        cells += [f"{ratio[w]:.2f}" for w in widths[1:]]
        cells += [f"{r['max_abs_logit_diff']:.2f}", f"{r['top1_agreement']:.3f}"]
        if role == "target" and "greedy_equal" not in r:
            cells += ["(not run)", "-"]
        elif role == "target":
            firsts = ",".join("-" if f is None else str(f) for f in r["first_differences"])
            cells += [str(r["greedy_equal"]), firsts]
        else:
            cells += [f"{r['target_agreement']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def chart(results: list[dict], path: Path) -> None:
    plt = kit.pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 5))
    for ax, res in zip(np.atleast_1d(axes), results, strict=True):
        for name, r in res["rows"].items():
            x, y = 1000 / {int(k): v for k, v in r["ms"].items()}[1], r["top1_agreement"]
            ax.scatter(x, y, color="tab:red" if name.startswith("native") else "tab:blue")
            ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(f"1-token steps per second at context {CONTEXT} (one forward)")
        ax.set_ylabel("top-1 agreement with the fp32 bundle (real text)")
        ax.set_title(f"{res['role']}: speed against fidelity (red: the GGUF's own weights)")
        ax.grid(alpha=0.3)
    kit.save_figure(fig, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=kit.ROOT / "results/quant")
    parser.add_argument("--role", choices=["target", "draft", "both"], default="both")
    parser.add_argument("--reps", type=int, default=9, help="timed rounds per variant (alternating with baseline)")
    parser.add_argument("--fresh", action="store_true", help="measure every variant again (default: keep saved rows)")
    parser.add_argument("--speed-only", action="store_true", help="re-measure the speed of saved rows, keep fidelity")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    roles = ["target", "draft"] if args.role == "both" else [args.role]
    texts_file = args.out / "texts.json"  # the fp32 target's continuations: the text both roles are scored on
    if not texts_file.exists():
        from specrt.prompts import DEFAULT_PROMPTS

        kit.log("reference continuations from the fp32 target")
        texts_file.write_text(json.dumps(reference_texts(reference_bundle("target"), DEFAULT_PROMPTS, 128)))
    texts = json.loads(texts_file.read_text())
    for role in roles:
        result = measure_role(role, args.reps, texts, args.out / f"{role}.json", args.fresh, args.speed_only)
        result["command"] = kit.command_line()
        result["measured"] = time.strftime("%Y-%m-%d %H:%M")
        kit.write_json(args.out / f"{role}.json", result)
    results = [json.loads(p.read_text()) for r in ("target", "draft") if (p := args.out / f"{r}.json").exists()]
    md = []
    for res in results:
        md += [f"### {res['role']} (reference {res['reference']}; measured {res['measured']}: `{res['command']}`)", ""]
        md += table(res) + [""]
    kit.write_outputs(args.out, "quant", "\n".join(md), chart=lambda path: chart(results, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
