"""Writing weights: an append-only external-data file, float weights in the bundle's dtype, and block-wise
int4/int8 weight quantization.

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

    def tensor(self, name: str, array: np.ndarray, packed: tuple[int, list[int]] | None = None) -> Any:
        """A TensorProto for `array`: inline when tiny, otherwise appended to the data file. `packed`
        (data type, dims) stores `array`'s bytes as a type numpy lacks (INT4/UINT4, two per byte)."""
        from onnx import TensorProto, helper, numpy_helper

        array = np.ascontiguousarray(array)
        if array.nbytes < INLINE_BYTES and packed is None:
            return numpy_helper.from_array(array, name)
        if array.nbytes < INLINE_BYTES:
            return helper.make_tensor(name, packed[0], packed[1], array.tobytes(), raw=True)
        pad = -self.offset % (ALIGN if array.nbytes >= ALIGN else 64)
        if pad:
            self._write(b"\0" * pad)
            self.offset += pad
        self._write(memoryview(array.view(np.uint8)).cast("B"))  # no bytes copy (bfloat16 has no buffer format)
        proto = TensorProto()
        proto.name = name
        proto.data_type = packed[0] if packed else helper.np_dtype_to_tensor_dtype(array.dtype)
        proto.dims.extend(packed[1] if packed else array.shape)
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", self.offset), ("length", array.nbytes)):
            entry = proto.external_data.add()
            entry.key, entry.value = key, str(value)
        self.offset += array.nbytes
        return proto

    def close(self) -> None:
        self._file.close()


def in_dtype(array: np.ndarray, dtype: str, name: str) -> np.ndarray:
    """A float32 weight in the bundle's dtype: fp32 as is, fp16 (numpy's half; refused when a finite value
    overflows it), bf16 (ml_dtypes' bfloat16, which onnx writes as BFLOAT16: round to nearest even)."""
    from ..errors import ExportError

    if dtype == "fp32":
        return array
    if dtype == "bf16":
        import ml_dtypes

        return array.astype(ml_dtypes.bfloat16)
    with np.errstate(over="ignore"):
        narrow = array.astype(np.float16)
    if not np.isfinite(narrow).all() and np.isfinite(array).all():
        worst = float(np.abs(array).max())
        raise ExportError(
            f"weight {name}: |value| up to {worst:.4g} overflows fp16 (max 65504); export with --dtype bf16"
        )
    return narrow


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


def to_qdq(
    packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, bits: int, k: int, n: int, block: int
) -> tuple[np.ndarray, int, np.ndarray, np.ndarray | None, int]:
    """The same blocks in DequantizeLinear form (weight [K, N], blocked along K): returns the weight's bytes
    and ONNX data type, scales [K / block, N] and zero points' bytes (or None) with their data type. Symmetric
    blocks become signed codes (INT4/INT8, zero point 0); others keep unsigned codes and their zero points."""
    from onnx import TensorProto

    def codes_of(p: np.ndarray, rows: int, width: int) -> np.ndarray:  # MatMulNBits rows -> [rows, width]
        flat = p.reshape(rows, -1)
        if bits == 4:
            flat = np.stack([flat & 0x0F, flat >> 4], axis=-1).reshape(rows, -1)
        return flat[:, :width]

    def pack(values: np.ndarray) -> np.ndarray:  # row-major, two 4-bit values per byte, first in the low nibble
        v = values.astype(np.uint8).reshape(-1) & 0x0F
        if v.size % 2:
            v = np.append(v, np.uint8(0))
        return v[0::2] | (v[1::2] << 4)

    nb = -(-k // block)
    codes = codes_of(packed, n, k).T  # [K, N]
    scale = np.ascontiguousarray(scales.reshape(n, nb).T, dtype=np.float32)
    if zero_points is None:  # symmetric: value = code - 2^(bits-1), a signed code with zero point 0
        signed = codes.astype(np.int16) - (1 << (bits - 1))
        if bits == 8:
            return signed.astype(np.int8), TensorProto.INT8, scale, None, TensorProto.INT8
        return pack(signed), TensorProto.INT4, scale, None, TensorProto.INT4
    zp = codes_of(zero_points, n, nb).T  # [K / block, N]
    if bits == 8:
        return codes.astype(np.uint8), TensorProto.UINT8, scale, zp.astype(np.uint8), TensorProto.UINT8
    return pack(codes), TensorProto.UINT4, scale, pack(zp), TensorProto.UINT4
