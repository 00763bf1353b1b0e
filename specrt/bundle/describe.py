"""A bundle described for a person (`specrt inspect`): architecture, quantization, graph, tokenizer, source,
validation figures and the cost profiles measured so far, one screenful."""

from __future__ import annotations

from pathlib import Path

from .manifest import PROFILE_DIR, Manifest


def human_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def describe(path: Path, m: Manifest) -> str:
    """What `specrt inspect` prints: the manifest in a screenful, and the cost profiles measured so far."""
    a, q = m.architecture, m.quantization
    size = sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
    if q.method == "none":
        quant = "none"
    elif q.method == "native":
        exact = sum("NOT exact" not in v for v in q.tensors.values())
        quant = (
            f"native (the GGUF's own blocks, MatMulNBits accuracy level {q.accuracy_level}; {exact} of "
            f"{len(q.tensors)} weights exact, see inspect --json)"
        )
    else:
        head = f"int{q.lm_head_bits}" if q.lm_head_bits else ("quantized" if q.lm_head else "fp32")
        quant = (
            f"{q.method} (MatMulNBits, block {q.block_size}, {'symmetric' if q.symmetric else 'asymmetric'}, "
            f"accuracy level {q.accuracy_level}, LM head {head})"
        )
    sends_mask = m.graph.flavour == "standard" and m.graph.masks == "runtime"
    lines = [
        f"bundle        {path}  ({size / 2**20:.1f} MiB)",
        f"name / role   {m.name} / {m.role}   (schema {m.schema_version}, created {m.created})",
        f"architecture  {a.model_type}: {a.num_layers} layers, hidden {a.hidden_size}, heads {a.num_heads}/"
        f"{a.num_kv_heads} kv, head_dim {a.head_dim}, vocab {a.vocab_size}"
        + (f" (padded from {a.padded_from})" if a.padded_from else ""),
        f"max_seq_len   {m.max_seq_len}   dtype {m.dtype}   quantization {quant}",
        f"graph         {m.graph.flavour} ({m.graph.attention}, opset {m.graph.opset}"
        + (", mask sent by the runtime: re-export for the in-graph one)" if sends_mask else ")"),
        f"tokenizer     {m.tokenizer.sha256[:16]}  eos {m.tokenizer.eos_token_ids}  "
        f"chat template {'yes' if m.tokenizer.chat_template else 'no'}",
        f"source        {m.source.path} ({m.source.format}, sha256 {m.source.weights_sha256[:16]})",
        "versions      " + ", ".join(f"{k} {v}" for k, v in m.versions.items()),
    ]
    if m.tensorrt is None:
        trt = "unknown (exported before the check: re-export to know)"
    else:
        trt = "no: " + "; ".join(m.tensorrt) if m.tensorrt else "yes (--device tensorrt)"
    lines.append(f"TensorRT-ready {trt}")
    v = m.validation
    if v is None:
        lines.append("validation    not run (exported with --no-validate)")
    else:
        gate = f"relative tolerance {v.tolerance:g}, passed" if v.tolerance is not None else "not gated (quantized)"
        lines.append(
            f"validation    vs {v.reference}: max |diff| {v.max_abs_diff:.3g}, "
            f"top-1 agreement {v.top1_agreement:.3f} ({gate})"
        )
        for s in v.steps:
            lines.append(f"  {s.name:<16} max |diff| {s.max_abs_diff:.3g}  top-1 {s.top1_agreement:.2f}")
    profiles = sorted((Path(path) / PROFILE_DIR).glob("*.json")) if (Path(path) / PROFILE_DIR).is_dir() else []
    lines.append(f"cost profiles {len(profiles)} ({', '.join(p.stem for p in profiles) or 'none: run specrt profile'})")
    return "\n".join(lines)
