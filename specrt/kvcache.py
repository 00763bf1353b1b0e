"""The KV cache: preallocated per-layer key/value buffers and one length counter.

The buffers are OrtValues of shape [1, kv_heads, max_len, head_dim], allocated once where the model runs
(host memory, or the GPU). The graph writes new keys/values into them in place at positions
[length, length + n). Slots at or beyond `length` are never read, so rolling back rejected draft tokens
is arithmetic on the counter, not a copy. The cache also remembers which token ids it holds, so a new
prompt that shares a prefix with them reuses that part. This module does not run models.
"""

from __future__ import annotations

import numpy as np


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: type = np.float32,
        device: str = "cpu",
        device_id: int = 0,
    ):
        import onnxruntime as ort

        shape = [1, num_kv_heads, max_len, head_dim]
        self.max_len = max_len
        if device == "cpu":
            # Zeroed host arrays wrapped without a copy (kept alive here): no uninitialised memory, ever.
            self._host = [np.zeros(shape, dtype) for _ in range(2 * num_layers)]
            values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._host]
        else:
            values = [
                ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, device, device_id)
                for _ in range(2 * num_layers)
            ]
        self.layers = list(zip(values[0::2], values[1::2], strict=True))
        self.ids: list[int] = []  # the tokens whose keys/values occupy slots [0, length)
        self.nbytes = 2 * num_layers * int(np.prod(shape)) * np.dtype(dtype).itemsize

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def free(self) -> int:
        return self.max_len - self.length

    def advance(self, ids: list[int]) -> None:
        """Record that the graph has just written `ids` at slots [length, length + len(ids))."""
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
        """Keep the first `length` positions (no-op when the cache holds fewer)."""
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
