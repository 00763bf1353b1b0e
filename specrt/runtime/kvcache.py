"""The KV cache: preallocated per-layer key/value buffers with one row per sequence, and a length per row.

The buffers are [rows, kv_heads, max_len, head_dim], allocated once where the model runs (host memory, or
the GPU). Row r is a slot: one sequence's keys and values, written in place by the graph at positions
[length, length + n). Slots at or beyond a row's length are never read, so rolling back rejected draft
tokens is arithmetic on that row's counter, not a copy; a finished sequence frees its row by resetting
the counter, and the next one overwrites it. Each row also remembers which token ids it holds, so a new
prompt that shares a prefix with them reuses that part. This module does not run models.
"""

from __future__ import annotations

import numpy as np


class Row:
    """One slot's bookkeeping: the token ids whose keys/values occupy positions [0, length)."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.ids: list[int] = []

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def free(self) -> int:
        return self.max_len - self.length

    def advance(self, ids: list[int]) -> None:
        """Record that the graph has just written `ids` at positions [length, length + len(ids))."""
        if self.length + len(ids) > self.max_len:
            raise ValueError(f"KV cache overflow: length {self.length} + {len(ids)} > max_len {self.max_len}")
        self.ids.extend(ids)

    def rollback(self, n: int) -> None:
        """Forget the last n positions (rejected draft tokens): O(n) bookkeeping, buffers untouched."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot roll back {n} positions of {self.length}")
        if n:
            del self.ids[-n:]

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions (no-op when the row holds fewer)."""
        del self.ids[max(length, 0) :]

    def common_prefix(self, ids: list[int]) -> int:
        """How many leading positions of `ids` are already cached."""
        n = 0
        for a, b in zip(self.ids, ids, strict=False):
            if a != b:
                break
            n += 1
        return n

    def reset(self) -> None:
        self.ids.clear()


# graph.kv_dtype -> (numpy storage type, ONNX element type). numpy has no bfloat16: its buffers are uint16
# bytes that ONNX Runtime is told hold BFLOAT16.
KV_TYPES = {"float32": (np.float32, 1), "float16": (np.float16, 10), "bfloat16": (np.uint16, 16)}


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: str = "float32",
        device: str = "cpu",
        device_id: int = 0,
        rows: int = 1,
    ):
        import onnxruntime as ort

        shape = [rows, num_kv_heads, max_len, head_dim]
        storage, element_type = KV_TYPES[dtype]
        self.max_len, self.shape, self.dtype = max_len, shape, np.dtype(storage)
        # What IO binding is told the buffers hold (they are bound by pointer, so an OrtValue's own type does
        # not matter): a numpy type, or the ONNX type numpy lacks.
        self.bind_type = self.dtype if dtype != "bfloat16" else element_type
        if device == "cpu":
            # Zeroed host arrays wrapped without a copy (kept alive here): no uninitialised memory, ever.
            self._host = [_resident(shape, storage) for _ in range(2 * num_layers)]
            values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._host]
        else:
            # Zeros copied to the device, one layer's worth of host memory at a time: memory fresh from a
            # device allocator holds anything, NaN included, and a masked attention does not cancel NaN
            # (0 x NaN = NaN) in the padding slots it reads.
            zeros = np.zeros(shape, storage)
            values = [ort.OrtValue.ortvalue_from_numpy(zeros, device, device_id) for _ in range(2 * num_layers)]
        self.layers = list(zip(values[0::2], values[1::2], strict=True))
        self.rows = [Row(max_len) for _ in range(rows)]
        self.row_nbytes = int(np.prod(shape[1:])) * self.dtype.itemsize  # one slot of one buffer
        self.nbytes = 2 * num_layers * rows * self.row_nbytes


def _resident(shape: list[int], storage) -> np.ndarray:
    """A zeroed array whose pages are in memory now. `np.zeros` maps zero pages lazily (calloc), and a slot's
    pages then came in at its first run, inside the graph's attention over the slot (with transparent huge
    pages, one 2 MiB fault per buffer and head, each zeroed and perhaps compacted for): the int4 0.5B draft fed
    192 tokens into a slot never used took 732-766 ms, into a used one 465-473, ~280 ms for its 96 MiB (Xeon,
    2 cores; results/trust/kv-first-touch). Written here, all slots come in at load (768 MiB in 1.5 s), and
    a request's first run in a slot, its timings and what the cost models learn from them are those of every
    later one."""
    array = np.empty(shape, storage)
    array.fill(0)
    return array
