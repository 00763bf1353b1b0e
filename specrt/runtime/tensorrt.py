"""ONNX Runtime's TensorRT provider for a bundle's model graph (`--device tensorrt[:N]`): whether the bundle can
go there, and the provider options it runs with.

- `refusal`: why a bundle cannot run on TensorRT (the exporter recorded what TensorRT's ONNX parser would
  refuse in the manifest, export/tensorrt.py), with the export flags that fix it; None when it can.
- `options`: the provider options. fp16 / bf16 kernels as the bundle's dtype asks; the engine and timing
  caches in a folder of the bundle per machine (`tensorrt/<GPU model>-trt<version>/`: an engine built for
  one GPU and TensorRT version is useless to another, and building one takes minutes); one optimisation
  profile for prefill chunks (one row) and one per batch bucket (rows up to 1, 2, 4, ... max rows) for the
  decode and verify widths 1..max_width; CUDA graphs on.
The model graph alone runs on TensorRT; the sampler graphs (small, many shapes) run on the CUDA provider of
the same device, and a node TensorRT does not take falls back to CUDA, never to the CPU (the placement check).
Built and checked on the CPU (tests/test_tensorrt.py); never run against TensorRT itself.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from ..bundle.loading import Bundle

FOLDER = "tensorrt"
PREFILL_CHUNK = 128  # the engine's default prefill chunk (one row at a time)
MAX_WIDTH = 65  # decode and verify: 1 + up to 64 draft tokens (GenerationOptions.max_draft_tokens' ceiling)
FIX = (
    "re-export with --graph standard --weights qdq --symmetric and either no --quant (fp32/fp16) or --quant int4 "
    "--block-size 128 (or 64) with --lm-head int4 or fp32"
)


def refusal(bundle: Bundle) -> str | None:
    """Why `bundle` cannot run on TensorRT, in one line naming the fix; None when it can."""
    reasons = bundle.manifest.tensorrt
    if reasons is None:
        return f"{bundle.path}: exported before specrt checked graphs for TensorRT; {FIX}"
    if reasons:
        return f"{bundle.path}: TensorRT cannot take this graph ({'; '.join(reasons)}); {FIX}"
    return None


def gpu_model(device_id: int, root: Path = Path("/proc/driver/nvidia/gpus")) -> str:
    """The GPU's model name as the NVIDIA driver reports it (its `information` files), else 'unknown-gpu'."""
    models = []
    for info in sorted(root.glob("*/information")) if root.is_dir() else []:
        found = re.search(r"^Model:\s*(.+)$", info.read_text(errors="replace"), re.M)
        models.append(found.group(1).strip() if found else "unknown-gpu")
    return models[device_id] if device_id < len(models) else "unknown-gpu"


def tensorrt_version() -> str:
    """TensorRT's version, from whichever of its wheels is installed ('unknown' when none is)."""
    for name in ("tensorrt", "tensorrt-cu13-libs", "tensorrt-cu12-libs", "tensorrt-libs"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def cache_folder(bundle: Bundle, device_id: int, gpu: str | None = None, version: str | None = None) -> Path:
    """The bundle's folder for this machine's TensorRT engines and timing cache."""
    gpu = gpu_model(device_id) if gpu is None else gpu
    version = tensorrt_version() if version is None else version
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{gpu}-trt{version}").strip("-").lower()
    return Path(bundle.path) / FOLDER / slug


def buckets(rows: int) -> list[int]:
    """Batch buckets: 1, 2, 4, ... up to and including `rows`."""
    out = [1]
    while out[-1] < rows:
        out.append(min(2 * out[-1], rows))
    return out


def profiles(bundle: Bundle, rows: int, max_width: int = MAX_WIDTH) -> list[dict[str, tuple]]:
    """Optimisation profiles: per profile, each dynamic input's (min, opt, max) shape. First the prefill chunks
    (one row, widths past the verify widths up to the chunk), then one per batch bucket (the rows of a run
    are a slot range of up to that many, widths 1..max_width, optimised for 1-token steps)."""
    m = bundle.manifest
    g, a = m.graph, m.architecture
    kv = (a.num_kv_heads, m.max_seq_len, a.head_dim)

    def profile(b: tuple[int, int, int], s: tuple[int, int, int]) -> dict[str, tuple]:
        shapes = {
            g.input_ids: tuple((b[i], s[i]) for i in range(3)),
            g.write_index: tuple((b[i],) for i in range(3)),
            g.new_tokens: tuple((b[i],) for i in range(3)),
            g.logits_rows: ((1,), (b[1] * s[1],), (b[2] * s[2],)),
        }
        for layer in range(a.num_layers):
            for name in g.kv_names(layer)[:2]:
                shapes[name] = tuple((b[i], *kv) for i in range(3))
        return shapes

    out = []
    if PREFILL_CHUNK > max_width:
        out.append(profile((1, 1, 1), (max_width + 1, PREFILL_CHUNK, PREFILL_CHUNK)))
    low = 1
    for bucket in buckets(rows):
        out.append(profile((low, bucket, bucket), (1, 1, max_width)))
        low = bucket + 1
    return out


def shape_option(profiles: list[dict[str, tuple]], which: int) -> str:
    """One of trt_profile_min/opt/max_shapes: 'name:AxB,...', each input once per profile, in profile order
    (ONNX Runtime reads an input named again as its shape in the next profile)."""
    return ",".join(f"{name}:{'x'.join(str(d) for d in shapes[which])}" for p in profiles for name, shapes in p.items())


def options(bundle: Bundle, device_id: int, rows: int, cache: Path | None = None) -> dict[str, str]:
    """The TensorRT provider's options for `bundle` at up to `rows` rows."""
    cache = cache_folder(bundle, device_id) if cache is None else cache
    p = profiles(bundle, rows)
    dtype = bundle.manifest.dtype
    return {
        "device_id": str(device_id),
        "trt_fp16_enable": "1" if dtype == "fp16" else "0",
        "trt_bf16_enable": "1" if dtype == "bf16" else "0",
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": str(cache),
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": str(cache),
        "trt_profile_min_shapes": shape_option(p, 0),
        "trt_profile_opt_shapes": shape_option(p, 1),
        "trt_profile_max_shapes": shape_option(p, 2),
        "trt_cuda_graph_enable": "1",
    }
