"""Which ONNX Runtime providers a session runs on, with which settings, and the check that its arithmetic
stayed on the device it was asked to run on.

- `parse_device`: "cpu", "cuda" or "cuda:N" -> (device, device id).
- `provider_list`: the providers and their options. On CUDA: the device id; the arena grown by what is
  asked for (the KV slots are allocated once, at load: doubling the arena past them wastes device memory);
  cuDNN off (specrt's graphs have no convolution, and a machine without cuDNN then still runs them);
  TF32 off unless asked for (ONNX Runtime turns it on for float32 MatMuls by default, and a float32 bundle
  then computes different logits than on the CPU: greedy output could part from target-only decoding).
- `session_entries`: on a device other than the CPU, ONNX Runtime records where it placed each node.
- `misplaced`: the compute nodes (matrix products, attention, norms, softmax, the KV update) that ONNX
  Runtime placed on the CPU provider of a GPU session: each would copy its inputs across the bus every
  run, a silent slowdown; the session refuses them (ONNX Runtime's own `session.disable_cpu_ep_fallback`
  also refuses the small shape computations it puts on the CPU on purpose, so it is not used).
- `out_of_memory`: whether a load failure was the device running out of memory.
Only the CPU provider runs on these machines: everything here is checked on it up to the provider switch
(tests/test_providers.py); what the CUDA provider does with these settings has never run (README, GPUs).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import OptionsError

CPU, CUDA, TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
DEVICES = {"cpu": CPU, "cuda": CUDA}  # where buffers live; TensorRT runs on a CUDA device
# Provider options a given onnxruntime-gpu may not know: dropped, and the load tried again, when it refuses one.
OPTIONAL = ("enable_cudnn",)

# Node types that carry a model's arithmetic. ONNX Runtime may place small shape computations (Shape,
# Gather / Concat / Unsqueeze of sizes, Range) on the CPU beside a GPU provider on purpose; these never.
COMPUTE_OPS = frozenset(
    {
        "Attention",
        "ArgMax",
        "CumSum",
        "DequantizeLinear",
        "Gemm",
        "GroupQueryAttention",
        "LayerNormalization",
        "MatMul",
        "MatMulNBits",
        "MultiHeadAttention",
        "RMSNormalization",
        "ReduceMax",
        "RotaryEmbedding",
        "SimplifiedLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "Softmax",
        "TensorScatter",
        "TopK",
    }
)


def parse_device(text: str, what: str = "device") -> tuple[str, int]:
    """'cpu', 'cuda[:N]' or 'tensorrt[:N]' -> (device, device id); `what` names the setting in the error."""
    name, colon, index = str(text).partition(":")
    if name not in (*DEVICES, "tensorrt") or (name == "cpu" and colon) or (colon and not index.isdigit()):
        raise OptionsError(
            f"{what} {text!r} is not cpu, cuda, cuda:N, tensorrt or tensorrt:N (N: the GPU's index, 0, 1, ...)"
        )
    return name, int(index or 0)


def provider_list(
    device: str,
    device_id: int = 0,
    tf32: bool = False,
    tensorrt: dict[str, str] | None = None,
    cuda_graph: bool = False,
) -> list[tuple[str, dict[str, str]]]:
    """ONNX Runtime's `providers` argument: the device's provider with its options, then the CPU's (which
    takes nothing `misplaced` would refuse, only shape computations). tensorrt: the TensorRT provider's
    options (specrt/runtime/tensorrt.py), first, with CUDA behind it for what TensorRT does not take.
    cuda_graph: CUDA graphs captured per run option gpu_graph_id (runtime/cudagraphs.py)."""
    if device == "cpu":
        return [(CPU, {})]
    options = {
        "device_id": str(device_id),
        "arena_extend_strategy": "kSameAsRequested",
        "use_tf32": "1" if tf32 else "0",
        "enable_cudnn": "0",
        **({"enable_cuda_graph": "1"} if cuda_graph else {}),
    }
    return [*([(TENSORRT, tensorrt)] if tensorrt is not None else []), (DEVICES[device], options), (CPU, {})]


def without_option(providers: list[tuple[str, dict[str, str]]], message: str):
    """The providers less an optional option that `message` (a load failure) names; None when it names none."""
    for key in OPTIONAL:
        if key in message and any(key in options for _, options in providers):
            return [(name, {k: v for k, v in options.items() if k != key}) for name, options in providers]
    return None


def inference_session(
    model, so, device: str, device_id: int = 0, tf32: bool = False, tensorrt=None, cuda_graph: bool = False
):
    """An ONNX Runtime session of `model` on the device (with `session_entries` added to `so`); an optional
    provider option this onnxruntime refuses is dropped and the load tried again."""
    import onnxruntime as ort

    for key, value in session_entries(device).items():
        so.add_session_config_entry(key, value)
    providers = provider_list(device, device_id, tf32, tensorrt, cuda_graph)
    while True:
        try:
            return ort.InferenceSession(model, so, providers=providers)
        except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own types; the caller words it
            fewer = without_option(providers, str(e))
            if fewer is None:
                raise
            providers = fewer


def session_entries(device: str) -> dict[str, str]:
    return {} if device == "cpu" else {"session.record_ep_graph_assignment_info": "1"}


def placements(session) -> list[tuple[str, str, str]]:
    """(provider, node type, node name) of every node of a session made with `session_entries`."""
    return [
        (sub.ep_name, n.op_type, n.name)
        for sub in session.get_provider_graph_assignment_info()
        for n in sub.get_nodes()
    ]


def misplaced(placed: Iterable[tuple[str, str, str]], device: str) -> list[str]:
    """'type name' of each compute node placed on the CPU provider of a session asked to run on `device`."""
    if device == "cpu":
        return []
    return [f"{op} {name}" for provider, op, name in placed if provider == CPU and op in COMPUTE_OPS]


def out_of_memory(message: str) -> bool:
    text = message.lower()
    return any(s in text for s in ("out of memory", "failed to allocate memory", "cudaerrormemoryallocation"))
