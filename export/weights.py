"""Writing weights: an append-only external-data file, and block-wise int4/int8 weight quantization.

Each tensor is written as soon as it is produced and then dropped, so an export never holds two copies of
the model. Quantization calls ONNX Runtime's own block quantizer (the C++ kernel behind
`MatMulNBitsQuantizer`) one weight at a time instead of loading a whole fp32 graph into memory.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

ALIGN = 64 * 1024  # page/allocation-granularity aligned offsets let ONNX Runtime map weights directly
INLINE_BYTES = 1024  # tiny tensors (shapes, norms of toy models) stay inside model.onnx


class ExternalData:
    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.offset = 0
        self._digest = hashlib.sha256()  # of everything written: the manifest records it (no second read)

    def _write(self, data: bytes | memoryview) -> None:
        self._file.write(data)
        self._digest.update(data)

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def tensor(self, name: str, array: np.ndarray) -> Any:
        """A TensorProto for `array`: inline when tiny, otherwise appended to the data file."""
        from onnx import TensorProto, helper, numpy_helper

        array = np.ascontiguousarray(array)
        if array.nbytes < INLINE_BYTES:
            return numpy_helper.from_array(array, name)
        pad = -self.offset % (ALIGN if array.nbytes >= ALIGN else 64)
        if pad:
            self._write(b"\0" * pad)
            self.offset += pad
        self._write(memoryview(array).cast("B"))  # no bytes copy of large tensors
        proto = TensorProto()
        proto.name = name
        proto.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        proto.dims.extend(array.shape)
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", self.offset), ("length", array.nbytes)):
            entry = proto.external_data.add()
            entry.key, entry.value = key, str(value)
        self.offset += array.nbytes
        return proto

    def close(self) -> None:
        self._file.close()


def quantize_blockwise(
    weight_in_out: np.ndarray, bits: int, block_size: int, symmetric: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Block quantization of a [K, N] weight along K, in MatMulNBits layout.

    Returns (packed uint8 [N, ceil(K / block), block * bits / 8], scales float32 [N, ceil(K / block)],
    zero points uint8 packed per row, or None when symmetric).
    """
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric, bits=bits)
    packed, scales, zero_points = DefaultWeightOnlyQuantizer(config).qbits_block_quant(
        np.ascontiguousarray(weight_in_out, dtype=np.float32)
    )
    return packed, scales, None if symmetric else zero_points
