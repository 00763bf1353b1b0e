"""GGUF-native weights: each GGUF tensor's own quantized codes carried into MatMulNBits, not re-quantized.

Every block format used here dequantizes as  w = scale * (code - zero) - offset  per block of the input
dimension, with an integer code, an integer `zero` fixed by the format, a float scale per block and (for the
"_K with min" formats) a float offset per block. `unpack` reads those pieces from the raw GGUF blocks with
the same arithmetic as the `gguf` package's own dequantization, so `reconstruct(unpack(t))` equals
`gguf.dequantize(t)` bit for bit (a test checks every tensor type we carry).

MatMulNBits computes y = A @ (scale * (code - zero_point))^T for 2-, 4- or 8-bit codes in blocks of a power
of two >= 16. The offset, when a format has one, is constant over a block, so its share of the product is
(A summed over each block) @ (-offset)^T: a ReduceSum and one small fp32 MatMul beside the kernel (the
"block-sum correction"). Per GGUF type:

| GGUF | codes | MatMulNBits | exact |
|---|---|---|---|
| Q4_0 | 4-bit, zero 8, block 32 | 4-bit, block 32, default zero point 8 | yes |
| Q4_K | 4-bit, scale d*sc, offset dmin*m per 32 | 4-bit, block 32, a zero point per block, + correction | 2 ulp |
| Q5_0 | 5-bit, zero 16, block 32 | 8-bit (code - 16 + 128), block 32 | yes |
| Q8_0 | 8-bit signed, block 32 | 8-bit (code + 128), block 32 | yes |
| Q6_K | 6-bit, zero 32, scale d*sc per 16 | 8-bit (code - 32 + 128), block 16 | yes |
| other quantized types | - | dequantized, then 8-bit block 32 symmetric (nearest) | no |
| F32, F16, BF16 | - | fp32 MatMul | yes |

For Q4_K the zero point of each block is the integer nearest offset / scale, and only the remainder
offset - scale * zero goes through the correction: the kernel then multiplies (int8-quantized, at accuracy
level 4) activations by weights centred like the real ones rather than by codes biased by the whole
offset, which doubled the logit error of activation quantization (max |diff| from the fp32 bundle 0.97
against 0.42 for 8-bit blocks on the 1.5B). The weights stay exact up to rounding: scale * (code - zero)
is exact in fp32, and the remainder is one fp32 subtraction, so each weight is within 2 ulp of `gguf`'s own
value (tests/test_native.py checks the bound; every other type is bit for bit). Only the weights are exact:
at accuracy level 4 the kernel also quantizes the activations to int8 per block (accuracy level 1 keeps
them fp32). This module knows GGUF blocks and MatMulNBits layouts; which
tensor goes where in the graph is graph.py's business.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EXACT_TYPES = ("Q4_0", "Q4_K", "Q5_0", "Q8_0", "Q6_K")
FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass
class Blocks:
    """A [N, K] weight (HF layout: rows are outputs) as  scale * (code - zero) - offset  per block along K."""

    gguf_type: str
    codes: np.ndarray  # uint8 [N, K]
    scales: np.ndarray  # float32 [N, K / block]
    offsets: np.ndarray | None  # float32 [N, K / block]; None when the format has no offset
    zero: int | np.ndarray  # the code that stands for 0 (before the offset): fixed, or uint8 [N, K / block]
    block: int
    exact: bool = True

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    def take_rows(self, order: np.ndarray) -> Blocks:
        """The same weight with its output rows reordered (blocks run along K, so rows move whole)."""
        off = None if self.offsets is None else self.offsets[order]
        zero = self.zero[order] if isinstance(self.zero, np.ndarray) else self.zero
        return Blocks(self.gguf_type, self.codes[order], self.scales[order], off, zero, self.block, self.exact)

    def centred(self) -> Blocks:
        """The same weight with each block's zero point at the integer nearest offset / scale and only the
        remainder left as offset (see the module docstring)."""
        if self.offsets is None:
            return self
        top = (1 << bits_for(self)) - 1
        safe = np.where(self.scales == 0, 1.0, self.scales)
        zero = np.clip(np.rint(self.offsets / safe), 0, top).astype(np.uint8)
        zero[self.scales == 0] = 0
        rest = (self.offsets - self.scales * zero.astype(np.float32)).astype(np.float32)
        return Blocks(self.gguf_type, self.codes, self.scales, rest, zero, self.block, self.exact)


def reconstruct(b: Blocks) -> np.ndarray:
    """The float32 weight these blocks stand for, computed in the order `gguf` computes it."""
    n, k = b.shape
    zero = b.zero[..., None].astype(np.float32) if isinstance(b.zero, np.ndarray) else np.float32(b.zero)
    codes = b.codes.reshape(n, k // b.block, b.block).astype(np.float32) - zero
    w = b.scales[..., None] * codes
    if b.offsets is not None:
        w = w - b.offsets[..., None]
    return w.reshape(n, k)


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.view(np.float16).astype(np.float32)


def unpack(data: np.ndarray, gguf_type: str, shape: tuple[int, int]) -> Blocks | None:
    """Blocks of a GGUF tensor's raw data ([N, bytes per row] uint8); None for float tensors and for types
    that cannot be carried exactly (the caller dequantizes those)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import Q4_K, QK_K

    if gguf_type not in EXACT_TYPES:
        return None
    n, k = shape
    qtype = GGMLQuantizationType[gguf_type]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = np.ascontiguousarray(data).reshape(-1, type_size)
    nb = blocks.shape[0]
    if gguf_type == "Q4_0":  # d (f16), 16 bytes of nibbles: first half low, second half high
        d, qs = np.hsplit(blocks, [2])
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
        return Blocks(gguf_type, q.reshape(n, k), _f16(d).reshape(n, -1), None, 8, 32)
    if gguf_type == "Q8_0":
        d, x = np.split(blocks, [2], axis=1)
        codes = (x.view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return Blocks(gguf_type, codes.reshape(n, k), _f16(d).reshape(n, -1), None, 128, 32)
    if gguf_type == "Q5_0":  # d, 32 high bits, 16 bytes of low nibbles
        d, rest = np.hsplit(blocks, [2])
        qh, qs = np.hsplit(rest, [4])
        qh = qh.copy().view(np.uint32).reshape(nb, 1) >> np.arange(32, dtype=np.uint32).reshape(1, 32)
        ql = (qs.reshape(nb, -1, 1, block_size // 2) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
        q = ql.reshape(nb, -1) | ((qh & 1).astype(np.uint8) << 4)  # 0..31, zero 16
        return Blocks(
            gguf_type, (q.astype(np.int16) + 112).astype(np.uint8).reshape(n, k), _f16(d).reshape(n, -1), None, 128, 32
        )
    if gguf_type == "Q4_K":  # d, dmin, 12 bytes of 6-bit scales/mins for 8 sub-blocks, 128 bytes of nibbles
        d, rest = np.hsplit(blocks, [2])
        dmin, rest = np.hsplit(rest, [2])
        packed_scales, qs = np.hsplit(rest, [Q4_K.K_SCALE_SIZE])
        sc, m = Q4_K.get_scale_min(packed_scales)
        scales = _f16(d) * sc.astype(np.float32)  # [nb, 8], as gguf computes d * sc
        offsets = _f16(dmin) * m.astype(np.float32)
        q = (qs.reshape(nb, -1, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
        return Blocks(gguf_type, q.reshape(n, k), scales.reshape(n, -1), offsets.reshape(n, -1), 0, 32)
    if gguf_type == "Q6_K":  # 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales, d
        ql, rest = np.hsplit(blocks, [QK_K // 2])
        qh, rest = np.hsplit(rest, [QK_K // 4])
        sc, d = np.hsplit(rest, [QK_K // 16])
        scales = _f16(d) * sc.copy().view(np.int8).astype(np.float32)  # [nb, 16]
        ql = (ql.reshape(nb, -1, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
        qh = (qh.reshape(nb, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 0x03
        q = ql.reshape(nb, -1, 32) | (qh.reshape(nb, -1, 32) << 4)  # 0..63, zero 32
        return Blocks(
            gguf_type, (q.astype(np.int16) + 96).astype(np.uint8).reshape(n, k), scales.reshape(n, -1), None, 128, 16
        )
    raise AssertionError(gguf_type)


def requantize_nearest(weight: np.ndarray, gguf_type: str, block: int = 32) -> Blocks:
    """A type we cannot carry exactly: symmetric 8-bit blocks of its dequantized values (the nearest we
    offer; the manifest says which tensors went this way)."""
    n, k = weight.shape
    w = weight.reshape(n, k // block, block)
    scales = np.abs(w).max(axis=-1) / 127.0
    safe = np.where(scales == 0, 1.0, scales)
    codes = np.clip(np.rint(w / safe[..., None]), -127, 127).astype(np.int16) + 128
    return Blocks(
        gguf_type, codes.astype(np.uint8).reshape(n, k), scales.astype(np.float32), None, 128, block, exact=False
    )


def bits_for(b: Blocks) -> int:
    fixed_zero = int(b.zero.max(initial=0)) if isinstance(b.zero, np.ndarray) else b.zero
    return 4 if fixed_zero < 16 and int(b.codes.max(initial=0)) < 16 else 8


@dataclass
class NBits:
    """MatMulNBits inputs for one (possibly fused) linear layer: y = kernel(A) + blocksum(A) @ correction."""

    packed: np.ndarray  # uint8 [N, K / block, block * bits / 8]
    scales: np.ndarray  # float32 [N * K / block]
    zero_points: np.ndarray | None  # uint8 packed [N, ceil(K / block * bits / 8)]; None: the default zero
    correction: np.ndarray | None  # float32 [K / block, N]: -offsets^T, or None
    bits: int
    block: int

    @property
    def n(self) -> int:
        return self.packed.shape[0]


def to_nbits(parts: list[Blocks]) -> NBits:
    """Pack one or more weights that share bits, block and zero handling into MatMulNBits layout, their
    output rows concatenated (the fused q/k/v or gate/up projections)."""
    bits = {bits_for(p) for p in parts}
    layout = {layout_key(p)[1:] for p in parts}
    assert len(bits) == 1 and len(layout) == 1, "fuse only weights of one layout"
    (bits,), ((block, zero, has_offset),) = bits, layout
    zero = np.concatenate([p.zero for p in parts]) if zero == "per block" else zero
    codes = np.concatenate([p.codes for p in parts])
    scales = np.concatenate([p.scales for p in parts])
    n, k = codes.shape
    nb = k // block
    default_zero = 1 << (bits - 1)
    if bits == 4:
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(n, nb, block // 2)
    else:
        packed = codes.reshape(n, nb, block)
    zero_points = None
    if isinstance(zero, np.ndarray) or zero != default_zero:  # explicit zero points, packed like the codes
        per_block = np.zeros((n, nb + (nb % 2 if bits == 4 else 0)), np.uint8)
        per_block[:, :nb] = zero
        zero_points = (per_block[:, 0::2] | (per_block[:, 1::2] << 4)) if bits == 4 else per_block
    correction = None
    if has_offset:
        correction = np.ascontiguousarray(-np.concatenate([p.offsets for p in parts]).T, dtype=np.float32)
    return NBits(
        np.ascontiguousarray(packed, dtype=np.uint8),
        np.ascontiguousarray(scales, dtype=np.float32).reshape(-1),
        zero_points,
        correction,
        bits,
        block,
    )


def layout_key(b: Blocks | None) -> tuple | None:
    """Weights with equal keys can share one MatMulNBits node; None marks a float weight."""
    if b is None:
        return None
    return bits_for(b), b.block, "per block" if isinstance(b.zero, np.ndarray) else b.zero, b.offsets is not None


def describe(b: Blocks | None, source_type: str) -> str:
    if b is None:
        return f"{source_type} -> fp32 MatMul (exact)"
    bits = bits_for(b)
    per_block = isinstance(b.zero, np.ndarray)
    extra = ", zero point per block" if per_block else (", zero points" if b.zero != 1 << (bits - 1) else "")
    extra += ", block-sum correction" if b.offsets is not None else ""
    how = "exact" if b.exact else "NOT exact: dequantized and re-quantized, the nearest format carried"
    how = "exact within 2 ulp" if b.exact and per_block and b.offsets is not None else how
    return f"{source_type} -> MatMulNBits {bits}-bit, block {b.block}{extra} ({how})"
