"""`SessionOptions`: how a bundle runs (device, threads, spinning, TF32, the attended-length bucket,
TensorRT, CUDA graphs), checked when made. Kept apart from generation options and from the session itself."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OptionsError
from .providers import DEVICES

GPU_BUCKET = 64  # attend_bucket's default on a GPU


@dataclass(frozen=True)
class SessionOptions:
    """How a bundle runs: device, threads, spinning. Kept apart from generation options."""

    device: str = "cpu"  # cpu | cuda
    device_id: int = 0  # which GPU (the CUDA provider's device_id; the KV buffers are allocated there)
    intra_op_threads: int = 0  # 0: ONNX Runtime's default (one per physical core)
    allow_spinning: bool = True  # worker threads spin while waiting for work instead of sleeping
    # False: they stop spinning as soon as a run returns (ONNX Runtime's session.force_spinning_stop). Two
    # sessions taking turns on the same cores want that: spinning inside a run keeps its parallel sections
    # fast, but threads still spinning after it steal the cores from the other session's run.
    spin_between_runs: bool = True
    # TF32 in float32 MatMuls on a GPU: faster, but the logits differ from the CPU's (and greedy output may
    # part from target-only decoding's). Off unless asked for.
    tf32: bool = False
    # The attended length T of a run rounded up to a multiple of this (bundles with the `attend_bucket`
    # input): 0 picks 1 (exact) on the CPU, where extra slots only cost, and 64 on a GPU (fixed shapes).
    attend_bucket: int = 0
    # The model graph on ONNX Runtime's TensorRT provider (device "cuda": buffers and sampler graphs there).
    tensorrt: bool = False
    # Decode and verify runs padded to a few shapes and replayed as CUDA graphs (runtime/cudagraphs.py).
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise OptionsError(f"device {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.tensorrt and self.device != "cuda":
            raise OptionsError("TensorRT runs on a CUDA device: tensorrt=True needs device 'cuda'")
        if self.attend_bucket < 0:
            raise OptionsError("attend_bucket must be >= 0 (0: 1 on the CPU, 64 on a GPU)")
        if self.intra_op_threads < 0:
            raise OptionsError("thread counts must be >= 0 (0 lets ONNX Runtime choose)")
