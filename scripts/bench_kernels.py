#!/usr/bin/env python
"""How one linear layer's time grows with the number of new tokens S, per weight format, on this CPU.

    python scripts/bench_kernels.py [--k 1536 --n 8960] [--threads 2]

A target mostly runs (k+1)-token verify passes and a draft mostly 1-token steps, so the format that is
fastest at S = 1 is not necessarily the best verifier. This measures t(S) for S = 1..16 for fp32 MatMul,
MatMulNBits int4/int8 at accuracy levels 1 (fp32 compute) and 4 (int8 compute), block sizes 32 and 128,
and DynamicQuantizeMatMul (int8 per-channel weights, dynamically quantized activations), interleaving the
formats so that machine drift hits them all alike. Prints a table of median ms and t(S)/t(1).
"""

from __future__ import annotations

import argparse
import statistics
import time

import benchkit as kit
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specrt.export.weights import quantize_blockwise

WIDTHS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16)


def graph(fmt: str, w: np.ndarray):
    k, n = w.shape
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", n])
    if fmt == "fp32":
        nodes, inits = [helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(w, "w")]
    elif fmt == "int8-dynamic":
        scale = np.abs(w).max(axis=0) / 127.0
        q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        nodes = [helper.make_node("DynamicQuantizeMatMul", ["x", "w", "s"], ["y"], domain="com.microsoft")]
        inits = [numpy_helper.from_array(q, "w"), numpy_helper.from_array(scale.astype(np.float32), "s")]
    else:  # int{bits}-acc{level}-b{block}
        bits_s, acc_s, block_s = fmt.split("-")
        bits, acc, block = int(bits_s[3:]), int(acc_s[3:]), int(block_s[1:])
        packed, scales, _ = quantize_blockwise(w, bits, block)
        nodes = [
            helper.make_node(
                "MatMulNBits",
                ["x", "w", "s"],
                ["y"],
                domain="com.microsoft",
                K=k,
                N=n,
                bits=bits,
                block_size=block,
                accuracy_level=acc,
            )
        ]
        inits = [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(scales, "s")]
    g = helper.make_graph(nodes, fmt, [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=1536)
    parser.add_argument("--n", type=int, default=8960)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    formats = [
        "fp32",
        "int4-acc4-b32",
        "int4-acc1-b32",
        "int4-acc4-b128",
        "int4-acc1-b128",
        "int8-acc4-b32",
        "int8-acc1-b32",
        "int8-dynamic",
    ]
    w = np.random.default_rng(0).normal(0, 0.02, (args.k, args.n)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    sessions = {f: ort.InferenceSession(graph(f, w), so, providers=["CPUExecutionProvider"]) for f in formats}
    xs = {s: np.random.default_rng(s).normal(0, 1, (1, s, args.k)).astype(np.float32) for s in WIDTHS}
    times = {(f, s): [] for f in formats for s in WIDTHS}
    for r in range(args.rounds):
        for f in kit.interleave(formats, r):
            for s in WIDTHS:
                for _ in range(3):
                    t0 = time.perf_counter()
                    sessions[f].run(None, {"x": xs[s]})
                    times[f, s].append(1000 * (time.perf_counter() - t0))
    print(f"one linear layer {args.k} x {args.n}, {args.threads} threads, median ms (t(S)/t(1) below)")
    print(f"{'format':<16}" + "".join(f"{'S=' + str(s):>8}" for s in WIDTHS))
    for f in formats:
        med = [statistics.median(times[f, s]) for s in WIDTHS]
        print(f"{f:<16}" + "".join(f"{m:8.2f}" for m in med))
        print(f"{'':<16}" + "".join(f"{m / med[0]:8.2f}" for m in med))


if __name__ == "__main__":
    main()
