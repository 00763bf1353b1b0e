"""The ONNX emitter the graph is written with: nodes and initializers, (quantized) linear layers, RMSNorm.

`GraphBuilder` knows ONNX and the bundle's number formats (float dtypes, block-quantized weights as
DequantizeLinear + MatMul or MatMulNBits, a GGUF's native blocks); it knows nothing about decoders, which
graph.py builds with it.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from ..bundle.manifest import Quantization
from .attention import MS_DOMAIN
from .native import NBits
from .weights import ExternalData, in_dtype, quantize_blockwise, to_qdq

ONNX_FLOAT = {"fp32": 1, "fp16": 10, "bf16": 16}  # TensorProto.FLOAT, FLOAT16, BFLOAT16


class GraphBuilder:
    """Collects nodes and initializers; knows how to emit a (quantized) linear layer and an RMSNorm.

    `dtype` is the bundle's: activations, KV buffers and float weights. `compute` is the type of the maths
    being emitted, the dtype except inside `float32()` (the final norm and the LM head)."""

    def __init__(self, data: ExternalData, quant: Quantization, opset: int = 24, dtype: str = "fp32"):
        self.data, self.quant, self.opset = data, quant, opset
        self.dtype = self.compute = dtype
        self.nodes: list = []
        self.initializers: list = []

    @property
    def float_type(self) -> int:
        """The ONNX element type of the activations being emitted."""
        return ONNX_FLOAT[self.compute]

    @contextmanager
    def float32(self):
        """Emit float32 maths (float constants in float32) inside the block."""
        saved, self.compute = self.compute, "fp32"
        try:
            yield
        finally:
            self.compute = saved

    def const(
        self, name: str, array: np.ndarray, packed: tuple[int, list[int]] | None = None, dtype: str | None = None
    ) -> str:
        """An initializer; float arrays in `dtype` (default: the maths being emitted)."""
        if packed is None and array.dtype.kind == "f":
            array = in_dtype(array, dtype or self.compute, name)
        self.initializers.append(self.data.tensor(name, array, packed))
        return name

    def float_weight(self, name: str, array: np.ndarray) -> str:
        """A float weight stored in the bundle's dtype and used in the maths' type: float32 maths over a
        narrower stored weight reads it through a Cast, which ONNX Runtime folds into a float32 copy at load
        (the file stays small; the LM head accumulates in float32)."""
        w = self.const(name, array, dtype=self.dtype)
        if self.compute == self.dtype:
            return w
        return self.op("Cast", [w], f"{name}/{self.compute}", to=self.float_type)

    def op(
        self,
        op_type: str,
        inputs: list[str],
        name: str,
        n_out: int | list[str] = 1,
        domain: str = "",
        **attrs,
    ):
        """Append a node; returns its output name (or names when it has several)."""
        from onnx import helper

        if isinstance(n_out, list):
            outputs = n_out
        else:
            outputs = [f"{name}/out{i}" if n_out > 1 else f"{name}/out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, domain=domain, **attrs))
        return outputs if len(outputs) > 1 else outputs[0]

    def linear(
        self, x: str, name: str, weight: np.ndarray, bias: np.ndarray | None, quantize: bool, bits: int | None = None
    ) -> str:
        """y = x W^T + b for an HF weight [out, in]: MatMul in fp32, MatMulNBits when quantized (`bits`
        overrides the body's bit width, for the LM head)."""
        q = self.quant
        bits = bits or q.bits
        if quantize and bits:
            block = q.block_size or 32
            packed, scales, zero_points = quantize_blockwise(weight.T, bits, block, q.symmetric)
            if q.form == "qdq":
                y = self.qdq_linear(x, name, packed, scales, zero_points, bits, weight.shape[1], weight.shape[0], block)
                return y if bias is None else self.op("Add", [y, self.const(f"{name}.bias", bias)], f"{name}/bias")
            attrs = {"K": weight.shape[1], "N": weight.shape[0], "bits": bits, "block_size": block}
            if q.accuracy_level:
                attrs["accuracy_level"] = q.accuracy_level
            inputs = [x, self.const(f"{name}.qweight", packed), self.const(f"{name}.scales", scales)]
            if zero_points is not None:
                inputs.append(self.const(f"{name}.zero_points", zero_points))
            y = self.op("MatMulNBits", inputs, name, domain=MS_DOMAIN, **attrs)
        else:
            y = self.op("MatMul", [x, self.float_weight(f"{name}.weight", weight.T)], name)
        if bias is not None:
            y = self.op("Add", [y, self.const(f"{name}.bias", bias)], f"{name}/bias")
        return y

    def qdq_linear(self, x, name, packed, scales, zero_points, bits: int, k: int, n: int, block: int) -> str:
        """The same blocks as standard ops: DequantizeLinear (blocked along K) then MatMul. TensorRT reads this
        form; ONNX Runtime may fuse it back into MatMulNBits (measured in the README)."""
        weight, wtype, scale, zp, ztype = to_qdq(packed, scales, zero_points, bits, k, n, block)
        inputs = [
            self.const(f"{name}.qweight", weight, packed=(wtype, [k, n])),
            self.const(f"{name}.scales", scale),
        ]
        if zp is not None:
            inputs.append(self.const(f"{name}.zero_points", zp, packed=(ztype, list(scale.shape))))
        w = self.op("DequantizeLinear", inputs, f"{name}/dequantize", axis=0, block_size=block)
        return self.op("MatMul", [x, w], name)

    def nbits_linear(self, x: str, name: str, w: NBits, k: int) -> str:
        """A GGUF-native linear layer: MatMulNBits over the file's own codes (or the same blocks as
        DequantizeLinear + MatMul, form qdq), plus the block-sum correction for formats with a per-block
        offset (see native.py)."""
        if self.quant.form == "qdq":
            y = self.qdq_linear(x, name, w.packed, w.scales, w.zero_points, w.bits, k, w.n, w.block)
        else:
            attrs = {"K": k, "N": w.n, "bits": w.bits, "block_size": w.block}
            if self.quant.accuracy_level:
                attrs["accuracy_level"] = self.quant.accuracy_level
            inputs = [x, self.const(f"{name}.qweight", w.packed), self.const(f"{name}.scales", w.scales)]
            if w.zero_points is not None:
                inputs.append(self.const(f"{name}.zero_points", w.zero_points))
            y = self.op("MatMulNBits", inputs, name, domain=MS_DOMAIN, **attrs)
        if w.correction is None:
            return y
        shape = self.const(f"{name}/blocks_shape", np.array([0, 0, k // w.block, w.block]))
        blocks = self.op("Reshape", [x, shape], f"{name}/blocks")
        sums = self.op(
            "ReduceSum", [blocks, self.const(f"{name}/last", np.array([-1]))], f"{name}/block_sums", keepdims=0
        )
        offset = self.op("MatMul", [sums, self.const(f"{name}.correction", w.correction)], f"{name}/offset")
        return self.op("Add", [y, offset], f"{name}/corrected")

    def rms_norm(self, x: str, weight: np.ndarray, eps: float, name: str) -> str:
        """RMSNorm with float32 statistics: the standard RMSNormalization (opset 23) where the graph's opset
        has it, else ONNX Runtime's SimplifiedLayerNormalization (which it fuses with the residual Add)."""
        op = "RMSNormalization" if self.opset >= 23 else "SimplifiedLayerNormalization"
        return self.op(op, [x, self.const(f"{name}.weight", weight)], name, axis=-1, epsilon=eps)
