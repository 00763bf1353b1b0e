"""`load`: the bundles, the devices and the engine options a caller names, checked and turned into an `Engine`
(specrt.load, and every CLI command that runs bundles)."""

from __future__ import annotations

from dataclasses import replace

from ..errors import OptionsError
from ..runtime.providers import parse_device
from ..runtime.session import SessionOptions
from .api import Engine, PathLike


def load(
    target: PathLike,
    draft: PathLike | None = None,
    *,
    threads: int = 0,
    device: str = "cpu",
    draft_device: str | None = None,
    draft_threads: int | None = None,
    spinning: bool = True,
    ngram: bool = False,
    verify: bool = False,
    max_batch: int = 1,
    sampler: str = "auto",
    tf32: bool = False,
    cuda_graphs: bool = False,
) -> Engine:
    """Load bundles for generation. threads=0 lets ONNX Runtime choose; ngram=True adds prompt-lookup
    drafting (alone, or beside the draft model: with auto k the one promising more tokens/s drafts each round).
    Every load checks each bundle file's size and the small files' SHA-256 against the manifest; verify=True
    hashes the weights too (seconds per GB). max_batch: how many generations run at once as one batch
    (bundles of the standard graph; each row is a KV slot of max_seq_len positions in each model).
    sampler: where draft tokens are picked and drafts verified: "graph" (the bundle's sampler graphs, on the
    device the logits are on: only ids cross), "host" (numpy on logits read back), "auto" (graph when the
    bundle has the graphs). device: "cpu", "cuda[:N]" or "tensorrt[:N]" (the model graphs on ONNX Runtime's
    TensorRT provider, the sampler graphs on CUDA; bundles `specrt inspect` calls TensorRT-ready).
    draft_device: the draft's, when it is to run apart (a CPU draft beside a GPU target, or two GPUs): each
    model's sampler graphs then run on its own device and the two exchange token ids, plus, for a sampled
    verification, the verified rows' q (vocabulary floats per drafted position), never logits. tf32=True lets
    a GPU use TF32 in float32 MatMuls (faster; the logits then differ from the CPU's, and greedy output may
    part from target-only decoding's). cuda_graphs=True (a GPU) pads decode and verify runs to a few shapes
    replayed as CUDA graphs (specrt/runtime/cudagraphs.py).

    spinning=True lets ONNX Runtime's worker threads spin while a run waits for work (they sleep otherwise,
    and waking them costs at every parallel section). With a draft loaded they stop spinning as soon as a
    run returns: the two sessions take turns on the same cores, and threads still spinning after one's run
    steal the cores from the other's (scripts/bench_spinning.py, 2 cores, int4 1.5B + int4 0.5B: a 2-token
    verify takes 62 ms spinning during runs, 67 ms without spinning, 96 ms spinning throughout).
    """
    name, device_id = parse_device(device)
    if draft_device is not None and draft is None:
        raise OptionsError("draft_device is set but no draft bundle is loaded; pass a draft or drop draft_device")
    if cuda_graphs and name != "cuda":
        raise OptionsError(f"CUDA graphs need device cuda[:N], not {device!r}; drop cuda_graphs (--cuda-graphs)")
    opts = SessionOptions(
        device="cuda" if name == "tensorrt" else name,
        device_id=device_id,
        tensorrt=name == "tensorrt",
        cuda_graphs=cuda_graphs,
        intra_op_threads=threads,
        allow_spinning=spinning,
        spin_between_runs=draft is None,
        tf32=tf32,
    )
    draft_opts = replace(opts, intra_op_threads=threads if draft_threads is None else draft_threads)
    if draft_device is not None:
        draft_name, draft_id = parse_device(draft_device, "draft_device")
        trt = draft_name == "tensorrt"
        draft_opts = replace(draft_opts, device="cuda" if trt else draft_name, device_id=draft_id, tensorrt=trt)
        draft_opts = replace(draft_opts, cuda_graphs=cuda_graphs and draft_opts.device == "cuda" and not trt)
    return Engine(
        target,
        draft,
        opts,
        draft_opts,
        ngram=ngram,
        verify=verify,
        max_batch=max_batch,
        sampler=sampler,
        draft_apart=draft_device is not None,
    )
