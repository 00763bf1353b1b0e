"""The report of scripts/bench_peers.py: results.json, results.md (tables) and results.png (chart)."""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
from pathlib import Path

import benchkit as kit

from specrt.decoding.divergence import divergence


def _label(family: str, config: str) -> str:
    if family == "transformers-fp32":
        return "transformers fp32 target"
    if family == "transformers-assisted":
        return "transformers assisted (fp32 + fp32 draft)"
    if family == "genai-int4":
        return "genai int4 target" if config == "target-only" else f"genai int4 + int4 draft, {config}"
    if family == "llamacpp":
        return "llama.cpp Q4_K_M target" if config == "target-only" else f"llama.cpp + GGUF draft, {config}"
    if family.startswith("openvino-"):
        target = {"openvino-gguf": "OpenVINO GGUF", "openvino-ir": "OpenVINO int4 IR"}[family]
        if config == "target-only":
            return f"{target} target"
        if config.startswith("lookup"):
            return f"{target} + prompt lookup, {config.split()[-1]}"
        return f"{target} + int4 IR draft, {config}"
    target = family.split("-")[1]  # specrt-<target>[-ngram|-both]
    drafter = {"ngram": "n-gram", "both": "n-gram + int4 draft"}.get(family.split("-")[-1], "int4 draft")
    return f"specrt {target} target" if config == "target-only" else f"specrt {target} + {drafter}, {config}"


def _rows(results: list[dict]) -> list[dict]:
    """Flatten to one row per (configuration, prompt)."""
    out = []
    for res in results:
        family = res["config"]
        for r in res.get("rows", []):
            if family.endswith(("-ngram", "-both")) and r["config"] == "target-only":
                continue  # a second run of the same bundle's target-only row (its own speedups use it)
            label = _label(family, r["config"])
            rss = r.get("server_peak_rss_gib", res.get("peak_rss_gib"))  # llama.cpp: its server's own
            out.append({**r, "label": label, "family": family, "peak_rss_gib": rss})
    return out


@functools.cache
def _fp32_target():
    """specrt's fp32 target session (torch-free), opened once: the reference for divergence margins."""
    import specrt
    from specrt.runtime.session import ModelSession

    return ModelSession(specrt.open_bundle(kit.ROOT / "engines/qwen2.5-coder-1.5b-fp32"))


def _eos_ids() -> list[int]:
    """The target's end-of-sequence ids, from the int4 bundle's manifest (every run has that bundle: the
    prompts are encoded with its tokenizer; the fp32 one is only opened for divergence margins)."""
    import specrt

    return specrt.open_bundle(kit.ROOT / "engines/qwen2.5-coder-1.5b-int4").manifest.tokenizer.eos_token_ids


def equality_checks(rows: list[dict], prompts: list[dict]) -> list[str]:
    """Greedy outputs that must match, and where they do not, the position and the target's margin."""
    by = {(r["label"], r["prompt"]): r for r in rows}
    ids = {p["name"]: p["ids"] for p in prompts}
    pairs = [
        ("transformers assisted (fp32 + fp32 draft)", "transformers fp32 target"),
        ("specrt fp32 target", "transformers fp32 target"),
    ]
    pairs += [(r["label"], "genai int4 target") for r in rows if r["label"].startswith("genai int4 +")]
    # llama.cpp computes with the GGUF's own weights, as the native bundle does (both against the fp32
    # bundle's margins: the GGUF's weights in fp32 arithmetic).
    pairs += [("llama.cpp Q4_K_M target", "specrt native target")]
    pairs += [(r["label"], "llama.cpp Q4_K_M target") for r in rows if r["label"].startswith("llama.cpp +")]
    # OpenVINO's speculative and lookup rows against its own target alone (bf16 activations on AVX512-BF16
    # CPUs: near-ties may round differently between a one-token step and a verify step); its GGUF target
    # against llama.cpp on the same file.
    for family in ("OpenVINO GGUF", "OpenVINO int4 IR"):
        pairs += [(r["label"], f"{family} target") for r in rows if r["label"].startswith(f"{family} +")]
    pairs += [("OpenVINO GGUF target", "llama.cpp Q4_K_M target")]
    eos = set(_eos_ids())
    lines = []
    for a, b in dict.fromkeys(pairs):
        found = [p for p in ids if (a, p) in by and (b, p) in by]
        if not found:
            continue
        bad, cut_at_eos = [], []
        for p in found:
            mine, ref = by[(a, p)]["token_ids"], by[(b, p)]["token_ids"]
            # Past an end-of-sequence token "EOS ignored" means different things: transformers and genai
            # mask EOS logits (min_new_tokens / min_length), specrt keeps decoding after it. So outputs are
            # compared up to the first EOS of either, and must agree up to there.
            first = next((i for i, (x, y) in enumerate(zip(mine, ref, strict=False)) if x in eos or y in eos), None)
            if first is not None:
                same = mine[first] == ref[first]
                if not same and mine[:first] == ref[:first]:
                    cut_at_eos.append(f"{p} (token {first})")
                mine, ref = mine[: first + same], ref[: first + same]
            if mine != ref:
                if "fp32" in b or "native" in b or "llama.cpp" in b:
                    d = divergence(_fp32_target(), ids[p], ref, mine)
                    bad.append(f"{p} at token {d['position']} (fp32 target top-2 margin {d['top2_margin']:.3g})")
                else:
                    pos = next((i for i, (x, y) in enumerate(zip(mine, ref, strict=False)) if x != y), len(ref))
                    bad.append(f"{p} at token {pos}")
        verdict = "equal on all prompts" if not bad else "differs: " + "; ".join(bad)
        if cut_at_eos:
            verdict += "; compared up to the first EOS, where one emits it and the other masks it: " + ", ".join(
                cut_at_eos
            )
        lines.append(f"- {a} vs {b}: {len(found) - len(bad)}/{len(found)} equal. {verdict}")
    return lines


def write_report(results: list[dict], prompts: list[dict], out: Path, command: str, n: int) -> None:
    rows = _rows(results)
    names = [p["name"] for p in prompts]
    kinds = {p["name"]: p["kind"] for p in prompts}
    labels = list(dict.fromkeys(r["label"] for r in rows))
    by = {(r["label"], r["prompt"]): r for r in rows}
    (out / "results.json").write_text(
        json.dumps({"command": command, "max_new_tokens": n, "results": results, "prompts": prompts})
    )

    md = [
        f"Command: `{command}`  ",
        f"Machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; {n} new tokens per prompt, greedy, batch 1, EOS ignored.",
        "",
    ]
    reuse = [f"{r['config']} (measured {r['reused_from']})" for r in results if r.get("reused_from")]
    if reuse:
        md += ["Reused from an earlier run of the same command and prompts: " + ", ".join(reuse) + ".", ""]
    md.append("Tokens/s (end to end, prefill included; median of repeats):")
    md.append("")
    md.append("| configuration | " + " | ".join(names) + " | median | peak RSS GiB |")
    md.append("|---" * (len(names) + 3) + "|")
    for label in labels:
        vals = [by[(label, p)]["tokens_per_s"] if (label, p) in by else None for p in names]
        got = [v for v in vals if v is not None]
        rss = next((by[(label, p)]["peak_rss_gib"] for p in names if (label, p) in by), None)
        md.append(
            f"| {label} | "
            + " | ".join("-" if v is None else f"{v:.2f}" for v in vals)
            + f" | {statistics.median(got):.2f} | {'-' if rss is None else f'{rss:.1f}'} |"
            if got
            else ""
        )
    md += [
        "",
        "specrt speculative rows (per prompt): speedup over the same bundle's target-only run, acceptance, "
        "tokens per target pass, c = t_draft(1)/t_target(1), verify cost v = t(k+1)/t(1), Leviathan's "
        "predicted speedup E/(kc+v), efficiency = achieved/predicted (decode phase), time outside ONNX "
        "Runtime per round as a share of one target step, k per round, greedy equality with target-only:",
        "",
    ]
    md.append(
        "| configuration | prompt | speedup | accept | tok/pass | c | v | predicted | efficiency | overhead | k "
        "(rounds) | equal |"
    )
    md.append("|---" * 12 + "|")
    for r in rows:
        if r["family"].startswith("specrt") and r["config"] != "target-only":
            eq = "yes" if r["equal_to_target_only"] else f"no {r['divergence']}"
            md.append(
                f"| {r['label']} | {r['prompt']} | {r['speedup']:.2f}x | {100 * r['acceptance_rate']:.0f}% | "
                f"{r['tokens_per_pass']:.2f} | {r['c']:.3f} | {r['verify_cost']:.2f} | "
                f"{r['predicted_speedup']:.2f}x | {r['efficiency']:.2f} | {100 * r['overhead_vs_step']:.1f}% | "
                f"{' '.join(f'{k}:{n}' for k, n in r['k_histogram'].items())} | {eq} |"
            )
    md += ["", "Equality of greedy outputs:", "", *equality_checks(rows, prompts), ""]
    md += ["Targets:", "", *targets(rows, names)]
    (out / "results.md").write_text("\n".join(md) + "\n")
    chart(rows, labels, kinds, out / "results.png")


def targets(rows: list[dict], names: list[str]) -> list[str]:
    """The figures the issues set targets for, computed from this run."""
    by = {(r["family"], r["config"], r["prompt"]): r for r in rows}

    def per_prompt(family: str, config: str, fn) -> str:
        vals = [(p, fn(by[(family, config, p)], p)) for p in names if (family, config, p) in by]
        return ", ".join(f"{p} {v:.2f}" for p, v in vals) or "not run"

    def best_spec(family: str, p: str) -> float:
        return max(
            (
                r["tokens_per_s"]
                for r in rows
                if r["family"] == family and r["prompt"] == p and r["config"] != "target-only"
            ),
            default=float("nan"),
        )

    lines = []
    for family in dict.fromkeys(r["family"] for r in rows if r["family"].startswith("specrt")):
        for config in sorted({r["config"] for r in rows if r["family"] == family} - {"target-only"}):
            lines.append(
                f"- {family} {config}: speedup over its target-only per prompt: "
                + per_prompt(family, config, lambda r, p: r["speedup"])
            )
            eff = [r["efficiency"] for r in rows if r["family"] == family and r["config"] == config]
            lines.append(f"  efficiency median {statistics.median(eff):.2f}, min {min(eff):.2f}")
    assisted = "transformers assisted (fp32 + fp32 draft)"
    for family in ("specrt-fp32", "specrt-int4"):
        ratios = [
            (p, best_spec(family, p) / by[("transformers-assisted", "target+draft", p)]["tokens_per_s"])
            for p in names
            if ("transformers-assisted", "target+draft", p) in by
        ]
        ratios = [(p, v) for p, v in ratios if v == v]  # drop prompts this run did not measure
        if ratios:
            lines.append(
                f"- {family} speculative (best config) / {assisted}: " + ", ".join(f"{p} {v:.1f}x" for p, v in ratios)
            )
    plain = {r["prompt"]: r["tokens_per_s"] for r in rows if r["family"] == "llamacpp" and r["config"] == "target-only"}
    if plain:
        for family, what in (("specrt-native", "the GGUF's own weights"), ("specrt-int4", "re-quantized int4")):
            best, alone = [], []
            for p in names:
                mine = [r for r in rows if r["family"] == family and r["prompt"] == p]
                if p in plain and mine:
                    top = max(mine, key=lambda r: r["tokens_per_s"])
                    best.append(f"{p} {top['tokens_per_s'] / plain[p]:.2f}x ({top['config']})")
                    solo = [r["tokens_per_s"] for r in mine if r["config"] == "target-only"]
                    alone += [f"{p} {solo[0] / plain[p]:.2f}x"] if solo else []
            if best:
                lines.append(f"- fastest {family} configuration ({what}) / llama.cpp plain: " + ", ".join(best))
                lines.append(f"- {family} target alone / llama.cpp plain: " + ", ".join(alone))
        spec = [r for r in rows if r["family"] == "llamacpp" and r["config"] != "target-only"]
        for config in sorted({r["config"] for r in spec}):
            ratios = [
                f"{r['prompt']} {r['tokens_per_s'] / plain[r['prompt']]:.2f}x" for r in spec if r["config"] == config
            ]
            lines.append(f"- llama.cpp speculative {config} / llama.cpp plain: " + ", ".join(ratios))
    for family in ("openvino-gguf", "openvino-ir"):
        alone = {r["prompt"]: r["tokens_per_s"] for r in rows if r["family"] == family and r["config"] == "target-only"}
        spec = [r for r in rows if r["family"] == family and r["config"] != "target-only" and r["prompt"] in alone]
        for config in dict.fromkeys(r["config"] for r in spec):
            mine = [r for r in spec if r["config"] == config]
            ratios = [f"{r['prompt']} {r['tokens_per_s'] / alone[r['prompt']]:.2f}x" for r in mine]
            lines.append(f"- {family} {config} / its target alone: " + ", ".join(ratios))
        if plain and alone:
            ratios = [f"{p} {alone[p] / plain[p]:.2f}x" for p in names if p in alone and p in plain]
            lines.append(f"- {family} target alone / llama.cpp plain: " + ", ".join(ratios))
    genai = [r for r in rows if r["family"] == "genai-int4" and r["config"] != "target-only"]
    ratios = []
    for p in names:
        theirs = [r["tokens_per_s"] for r in genai if r["prompt"] == p]
        if ("specrt-int4", "auto", p) in by and theirs:
            ratios.append(f"{p} {by[('specrt-int4', 'auto', p)]['tokens_per_s'] / max(theirs):.2f}x")
    if ratios:
        lines.append("- specrt-int4 auto / best genai int4 speculative: " + ", ".join(ratios))
    ratios = []
    for p in names:
        theirs = [r["tokens_per_s"] for r in genai if r["prompt"] == p]
        mine = [
            r["tokens_per_s"]
            for r in rows
            if r["family"].startswith("specrt-int4") and r["prompt"] == p and r["config"] != "target-only"
        ]
        if theirs and mine:
            ratios.append(f"{p} {max(mine) / max(theirs):.2f}x")
    if ratios:
        lines.append("- best specrt int4 speculative configuration / best genai int4 speculative: " + ", ".join(ratios))
    return lines


def chart(rows: list[dict], labels: list[str], kinds: dict[str, str], path: Path) -> None:
    plt = kit.pyplot()
    if plt is None:
        return
    groups = sorted(set(kinds.values()))
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(labels) + 1.5))
    height = 0.8 / len(groups)
    for gi, kind in enumerate(groups):
        vals = []
        for label in labels:
            v = [r["tokens_per_s"] for r in rows if r["label"] == label and kinds[r["prompt"]] == kind]
            vals.append(statistics.median(v) if v else 0)
        ax.barh([i + gi * height for i in range(len(labels))], vals, height=height, label=f"{kind} prompts")
    ax.set_yticks([i + height * (len(groups) - 1) / 2 for i in range(len(labels))], labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("tokens/s (median over prompts of the kind)")
    ax.legend()
    ax.set_title(f"Qwen2.5-Coder 1.5B target, 0.5B draft, {os.cpu_count()}-core CPU")
    kit.save_figure(fig, path)
