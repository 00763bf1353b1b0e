"""Attention flavours of the decoder graph: how a layer reads and writes its KV buffer, and which positions
reach the LM head. The rest of the decoder (embedding, projections, MLP, norms) is the same for both.

- "standard" (default): ai.onnx operators only, opset 24, any batch. The runtime sends per row only where
  its new keys/values go (`write_index [B]`, its past length) and how many of the S new tokens are real
  (`new_tokens [B]`); the graph builds from them each row's positions `past[b] + i` and the causal mask
  `[B, 1, S, T]` (T = max(past + new): the batch's longest row), so what crosses per run is O(B x S)
  integers. Per layer, RotaryEmbedding at each row's own positions, TensorScatter writes the S new
  keys/values of row b at `write_index[b]` into the layer's buffer `[B, kv_heads, max_seq_len, head_dim]`
  (bound by the runtime as both past input and present output: the scatter is the past input's only
  consumer, so ONNX Runtime updates the buffer in place), a Slice keeps the first T slots (without it the
  Attention kernel costs O(max_seq_len)), then Attention with the boolean mask (True: may attend). Rows
  are ragged: each row has its own past length and its own number of real new tokens, padded to the
  widest. The LM head sees only the positions in `logits_rows [N]` (indices into the flattened [B * S]
  positions). Bundles exported before the mask moved into the graph (`graph.masks = "runtime"`) take
  `position_ids [B, S]` and `attention_mask [B, 1, S, T]` from the runtime instead; the exporter still
  writes that form on request (`ExportOptions.masks`) so the runtime's support for it stays tested.
- "gqa": com.microsoft.GroupQueryAttention with RoPE inside and shared past/present buffers, batch 1 for
  multi-token passes (ONNX Runtime's CPU kernel refuses batch > 1 once a row has past context and S > 1);
  the LM head sees the last `logits_to_keep` positions.
"""

from __future__ import annotations

import numpy as np

MS_DOMAIN = "com.microsoft"
ATTEND_BUCKET = "attend_bucket"  # bundles of 2026-12-03: T rounded up inside the graph to this input's multiple
ATTEND_LENGTH = "attend_length"  # T itself, from the host
FLAVOURS = ("standard", "gqa")
OPSETS = {"standard": 24, "gqa": 18}


def head_norm(b, x: str, weight: np.ndarray, heads: int, d: int, eps: float, name: str) -> str:
    """RMSNorm over head_dim of each head (Qwen3's q_norm / k_norm): [B, S, heads*d] -> same shape."""
    split = b.op("Reshape", [x, b.const(f"{name}/heads_shape", np.array([0, 0, heads, d]))], f"{name}/to_heads")
    normed = b.rms_norm(split, weight, eps, name)
    return b.op("Reshape", [normed, b.const(f"{name}/flat_shape", np.array([0, 0, heads * d]))], f"{name}/flat")


class GQAAttention:
    name = "gqa"

    def inputs(self, g, tensor) -> list:
        from onnx import TensorProto as T

        return [
            tensor(g.input_ids, T.INT64, ["batch", "sequence"]),
            tensor(g.seqlens_k, T.INT32, ["batch"]),
            tensor(g.total_sequence_length, T.INT32, []),
            tensor(g.logits_to_keep, T.INT64, [1]),
        ]

    def logits_shape(self, vocab: int) -> list:
        return ["batch", "keep", vocab]

    def layer(self, dec, i: int, qkv: str, norms, window: int | None) -> str:
        b, a, g = dec.b, dec.arch, dec.g
        nh, kvh, d = a.num_heads, a.num_kv_heads, a.head_dim
        n = f"layers.{i}/attn"
        if norms is not None:  # Qwen3: RMSNorm over each head of q and k, before RoPE
            q_weight, k_weight, eps = norms
            sizes = b.const(f"{n}/qkv_sizes", np.array([nh * d, kvh * d, kvh * d]))
            q, k, v = b.op("Split", [qkv, sizes], f"{n}/split", n_out=3, axis=-1)
            q = head_norm(b, q, q_weight, nh, d, eps, f"{n}/q_norm")
            qkv_in = [q, head_norm(b, k, k_weight, kvh, d, eps, f"{n}/k_norm"), v]
        else:
            qkv_in = [qkv, "", ""]  # packed QKV: GroupQueryAttention splits it itself
        past_k, past_v, present_k, present_v = g.kv_names(i)
        attrs = {
            "num_heads": nh,
            "kv_num_heads": kvh,
            "do_rotary": 1,
            "rotary_interleaved": 0,
            "scale": dec.attention_scale,
        }
        if window is not None:
            attrs["local_window_size"] = int(window)  # the same span as transformers' sliding-window mask
        if dec.attention_softcap:
            attrs["softcap"] = float(dec.attention_softcap)  # Gemma 2: on the scaled logits, before the mask
        return b.op(
            "GroupQueryAttention",
            [*qkv_in, past_k, past_v, g.seqlens_k, g.total_sequence_length, *dec.rope(i)],
            f"{n}/gqa",
            n_out=[f"{n}/out", present_k, present_v],
            domain=MS_DOMAIN,
            **attrs,
        )[0]

    def select(self, dec, h: str) -> str:
        """The last `logits_to_keep` positions: prefill and draft steps need one, a verify pass k + 1."""
        b, g = dec.b, dec.g
        start = b.op("Neg", [g.logits_to_keep], "keep_start")
        end = b.const("keep_end", np.array([np.iinfo(np.int64).max]))
        return b.op("Slice", [h, start, end, b.const("keep_axis", np.array([1]))], "keep_last")


class StandardAttention:
    name = "standard"

    def __init__(self, masks: str = "graph") -> None:
        self.masks = masks  # graph: positions and mask built inside; runtime: sent as inputs (older bundles)
        self._shared: dict[str, str] = {}  # tensors every layer reads (T, positions, masks), built once

    def inputs(self, g, tensor) -> list:
        from onnx import TensorProto as T

        if self.masks == "runtime":
            rows = [
                tensor(g.position_ids, T.INT64, ["batch", "sequence"]),
                tensor(g.write_index, T.INT64, ["batch"]),
                tensor(g.attention_mask, T.BOOL, ["batch", 1, "sequence", "total"]),
            ]
        else:
            rows = [tensor(g.write_index, T.INT64, ["batch"]), tensor(g.new_tokens, T.INT64, ["batch"])]
            for name in (g.attend_length, g.attend_bucket):
                if name:
                    rows.append(tensor(name, T.INT64, [1]))
        return [tensor(g.input_ids, T.INT64, ["batch", "sequence"]), *rows, tensor(g.logits_rows, T.INT64, ["rows"])]

    def logits_shape(self, vocab: int) -> list:
        return ["rows", vocab]

    def _once(self, name: str, build) -> str:
        if name not in self._shared:
            self._shared[name] = build()
        return self._shared[name]

    def _attended(self, dec) -> str:
        """T [1]: how many slots the batch's longest row attends to after this run, at least max(past + new)."""
        b, g = dec.b, dec.g
        if g.attend_length:
            # Sent by the host (which knows every row's length): no shape here depends on data on the device,
            # so a GPU run reads nothing back while it runs (CUDA graphs capture it; TensorRT sees a shape
            # input). Slots past a row's length are masked, so any T from max(past + new) up is exact.
            return g.attend_length

        def build() -> str:
            if self.masks == "runtime":  # the mask's last dimension
                shape = b.op("Shape", [g.attention_mask], "mask_shape")
                dims = b.const("dim3", np.array([3])), b.const("dim4", np.array([4]))
                return b.op("Slice", [shape, *dims], "attended")
            ends = b.op("Add", [g.write_index, g.new_tokens], "row_ends")
            if not g.attend_bucket:
                return b.op("ReduceMax", [ends, b.const("all_rows", np.array([0]))], "attended", keepdims=1)
            # Rounded up to a multiple of the bucket input, at most the buffer's length: a GPU then sees a
            # few shapes (CUDA graphs, fp16 memory-efficient attention needs T % 4 == 0); the extra slots are
            # masked like any slot past a row's length.
            exact = b.op("ReduceMax", [ends, b.const("all_rows", np.array([0]))], "attended_exact", keepdims=1)
            step = g.attend_bucket
            less = b.op("Sub", [step, b.const("bucket/one", np.array([1]))], "bucket/less")
            count = b.op("Div", [b.op("Add", [exact, less], "bucket/up"), step], "bucket/count")
            rounded = b.op("Mul", [count, step], "bucket/rounded")
            return b.op("Min", [rounded, b.const("bucket/limit", np.array([dec.max_seq_len]))], "attended")

        return self._once("attended", build)

    def _position_ids(self, dec) -> str:
        """[B, S]: past[b] + i, each row's own positions (RoPE, the causal and sliding-window masks)."""
        b, g = dec.b, dec.g
        if self.masks == "runtime":
            return g.position_ids

        def build() -> str:
            shape = b.op("Shape", [g.input_ids], "ids_shape")
            width = b.op("Gather", [shape, b.const("seq_dim", np.array(1))], "width", axis=0)
            start, delta = b.const("steps/start", np.array(0)), b.const("steps/delta", np.array(1))
            steps = b.op("Range", [start, width, delta], "steps")
            past = b.op("Unsqueeze", [g.write_index, b.const("row_axis", np.array([1]))], "past_column")
            return b.op("Add", [past, steps], "position_ids")  # [B, 1] + [S]

        return self._once("positions", build)

    def _keys(self, dec) -> str:
        """[T]: the slot index of every attended key."""
        b = dec.b

        def build() -> str:
            length = b.op("Squeeze", [self._attended(dec)], "attended_scalar")
            start, delta = b.const("keys/start", np.array(0)), b.const("keys/delta", np.array(1))
            return b.op("Range", [start, length, delta], "keys")

        return self._once("keys", build)

    def _queries(self, dec) -> str:
        """[B, 1, S, 1]: each query's position, shaped to broadcast against the keys [T]."""
        b = dec.b

        def build() -> str:
            axes = b.const("query_axes", np.array([1, 3]))
            return b.op("Unsqueeze", [self._position_ids(dec), axes], "query_positions")

        return self._once("queries", build)

    def _mask(self, dec, window: int | None) -> str:
        """[B, 1, S, T]: query i of row b sees slots j <= past[b] + i; a sliding-window layer only those with
        j > position - window (transformers' window: p - window < j <= p)."""
        b = dec.b
        if self.masks == "runtime":
            causal = dec.g.attention_mask
        else:
            causal = self._once("causal", lambda: b.op("GreaterOrEqual", [self._queries(dec), self._keys(dec)], "mask"))
        if window is None:
            return causal

        def build() -> str:
            n = f"window{window}"
            first = b.op("Sub", [self._queries(dec), b.const(f"{n}/w", np.array(window - 1))], f"{n}/first")
            inside = b.op("GreaterOrEqual", [self._keys(dec), first], f"{n}/inside")
            return b.op("And", [causal, inside], f"{n}/mask")

        return self._once(f"window{window}", build)

    def layer(self, dec, i: int, qkv: str, norms, window: int | None) -> str:
        b, a, g = dec.b, dec.arch, dec.g
        nh, kvh, d = a.num_heads, a.num_kv_heads, a.head_dim
        n = f"layers.{i}/attn"
        # [B, S, (nh + 2 kvh) * d] -> [B, nh + 2 kvh, S, d] once, then split by heads: the attention, the
        # scatter and RoPE all take heads-first tensors, so no per-tensor reshapes (every node costs a few
        # microseconds of dispatch: for the 0.5B draft, ~6% of a step when q, k and v each had their own).
        heads = b.op("Reshape", [qkv, b.const(f"{n}/heads_shape", np.array([0, 0, nh + 2 * kvh, d]))], f"{n}/heads")
        heads = b.op("Transpose", [heads], f"{n}/heads_first", perm=[0, 2, 1, 3])
        rope = [*dec.rope(i), self._position_ids(dec)]
        if norms is None:  # RoPE on q and k together
            qk, v = b.op(
                "Split", [heads, b.const(f"{n}/qk_v", np.array([nh + kvh, kvh]))], f"{n}/split", n_out=2, axis=1
            )
            qk = b.op("RotaryEmbedding", [qk, *rope], f"{n}/rope")
            q, k = b.op("Split", [qk, b.const(f"{n}/q_k", np.array([nh, kvh]))], f"{n}/split_qk", n_out=2, axis=1)
        else:  # Qwen3: RMSNorm over each head of q and k (the last axis), before RoPE
            q_weight, k_weight, eps = norms
            sizes = b.const(f"{n}/q_k_v", np.array([nh, kvh, kvh]))
            q, k, v = b.op("Split", [heads, sizes], f"{n}/split", n_out=3, axis=1)
            q = b.op("RotaryEmbedding", [b.rms_norm(q, q_weight, eps, f"{n}/q_norm"), *rope], f"{n}/rope_q")
            k = b.op("RotaryEmbedding", [b.rms_norm(k, k_weight, eps, f"{n}/k_norm"), *rope], f"{n}/rope_k")
        past_k, past_v, present_k, present_v = g.kv_names(i)
        # The scatter is each past buffer's only reader: ONNX Runtime writes into the bound buffer in place.
        b.op("TensorScatter", [past_k, k, g.write_index], f"{n}/write_k", n_out=[present_k], axis=-2)
        b.op("TensorScatter", [past_v, v, g.write_index], f"{n}/write_v", n_out=[present_v], axis=-2)
        zero, axis = b.const(f"{n}/zero", np.array([0])), b.const(f"{n}/seq_axis", np.array([2]))
        keys = b.op("Slice", [present_k, zero, self._attended(dec), axis], f"{n}/keys")
        values = b.op("Slice", [present_v, zero, self._attended(dec), axis], f"{n}/values")
        y = b.op(
            "Attention",
            [q, keys, values, self._mask(dec, window)],
            f"{n}/attention",
            q_num_heads=nh,
            kv_num_heads=kvh,
            scale=dec.attention_scale,
            # Gemma 2: cap * tanh(x / cap) on the scaled logits, before the mask (as transformers does)
            **({"softcap": float(dec.attention_softcap)} if dec.attention_softcap else {}),
        )
        y = b.op("Transpose", [y], f"{n}/seq_first", perm=[0, 2, 1, 3])
        return b.op("Reshape", [y, b.const(f"{n}/out_shape", np.array([0, 0, nh * d]))], f"{n}/out")

    def select(self, dec, h: str) -> str:
        """The positions in logits_rows, out of the batch's flattened [B * S] positions."""
        b = dec.b
        flat = b.op("Reshape", [h, b.const("flat_shape", np.array([-1, dec.arch.hidden_size]))], "flat_positions")
        return b.op("Gather", [flat, dec.g.logits_rows], "logit_positions", axis=0)


def flavour(name: str, masks: str = "graph"):
    return StandardAttention(masks) if name == "standard" else GQAAttention()
