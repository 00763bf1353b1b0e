"""GGUF-native weights: the file's own blocks, unpacked bit for bit and run by MatMulNBits as they stand."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.export.native import EXACT_TYPES, bits_for, reconstruct, to_nbits, unpack

N, K = 24, 512  # two Q4_K/Q6_K super-blocks per row


def random_blocks(gguf_type: str, rng: np.random.Generator) -> np.ndarray:
    """Raw GGUF blocks of random bytes, with every fp16 field a finite, modest number."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[gguf_type]]
    raw = rng.integers(0, 256, size=(N * K // block_size, type_size), dtype=np.uint8)
    # Where the fp16 fields sit: d first (Q4_0, Q5_0, Q8_0), d and dmin first (Q4_K), d last (Q6_K).
    fields = {"Q4_0": [0], "Q5_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [type_size - 2]}[gguf_type]
    for at in fields:
        value = rng.uniform(0.001, 0.05, size=raw.shape[0]) * rng.choice([-1, 1], size=raw.shape[0])
        raw[:, at : at + 2] = value.astype(np.float16).reshape(-1, 1).view(np.uint8)
    return raw.reshape(N, -1)


@pytest.mark.parametrize("gguf_type", EXACT_TYPES)
def test_unpacked_blocks_equal_gguf_dequantization_bit_for_bit(gguf_type):
    from gguf import GGMLQuantizationType, dequantize

    raw = random_blocks(gguf_type, np.random.default_rng(0))
    expected = dequantize(raw, GGMLQuantizationType[gguf_type]).reshape(N, K)
    blocks = unpack(raw, gguf_type, (N, K))
    ours = reconstruct(blocks)
    assert ours.dtype == np.float32 and ours.shape == (N, K)
    assert np.array_equal(ours.view(np.uint32), expected.view(np.uint32))  # the same bits, not merely close
    # Rows move whole (the llama q/k un-permutation): reordering blocks equals reordering the weight.
    order = np.random.default_rng(1).permutation(N)
    assert np.array_equal(reconstruct(blocks.take_rows(order)), expected[order])
    # The form the graph carries: Q4_K with a zero point per block and the remainder as offset is within
    # 2 ulp of gguf's value (one more fp32 rounding); the other types are untouched, bit for bit.
    centred = reconstruct(blocks.centred())
    if gguf_type == "Q4_K":
        assert isinstance(blocks.centred().zero, np.ndarray) and (blocks.centred().zero > 0).any()
        ulp = np.spacing(np.maximum(np.abs(expected), np.abs(centred)))
        assert (np.abs(centred - expected) <= 2 * ulp).all()
        print(f"Q4_K centred: {np.mean(centred != expected):.4f} of weights differ, all within 2 ulp")
    else:
        assert np.array_equal(centred.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("gguf_type", EXACT_TYPES)
@pytest.mark.parametrize("accuracy_level", [1, 4])
def test_matmulnbits_runs_the_blocks_as_they_stand(gguf_type, accuracy_level):
    """One graph node (+ the correction) against A @ W^T with W the gguf dequantization. Accuracy level 1
    computes in fp32: only summation order differs. Level 4 quantizes A to int8 per block: within that."""
    import onnxruntime as ort
    from gguf import GGMLQuantizationType, dequantize
    from onnx import TensorProto, helper

    from specrt.bundle.manifest import Quantization
    from specrt.export.builder import GraphBuilder

    rng = np.random.default_rng(2)
    raw = random_blocks(gguf_type, rng)
    blocks = unpack(raw, gguf_type, (N, K)).centred()  # as GGUFCheckpoint.native hands them to the graph
    w = dequantize(raw, GGMLQuantizationType[gguf_type]).reshape(N, K)

    class Inline:  # every initializer inside the model
        def tensor(self, name, array, packed=None):
            from onnx import numpy_helper

            return numpy_helper.from_array(np.ascontiguousarray(array), name)

    b = GraphBuilder(Inline(), Quantization("native", None, None, accuracy_level, False))
    y = b.nbits_linear("x", "proj", to_nbits([blocks, blocks.take_rows(np.arange(N)[::-1])]), K)
    b.op("Identity", [y], "out", n_out=["y"])
    graph = helper.make_graph(
        b.nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 2 * N])],
        b.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 3, K)).astype(np.float32)
    got = session.run(None, {"x": x})[0][0]
    want = x[0].astype(np.float64) @ np.concatenate([w, w[::-1]]).T.astype(np.float64)
    scale = np.abs(want).max()
    error = np.abs(got - want).max() / scale
    print(f"{gguf_type} accuracy level {accuracy_level}: max error / max |y| = {error:.2e}")
    assert error < (1e-5 if accuracy_level == 1 else 2e-2), error
    assert bits_for(blocks) == (4 if gguf_type in ("Q4_0", "Q4_K") else 8)


@pytest.fixture(scope="module", params=[("qwen2", "Q8_0"), ("llama", "Q4_0"), ("qwen2", "Q5_0")])
def native_case(request, zoo):
    """A tiny GGUF of one block type, exported three ways: fp32 (its dequantized values) and native at
    accuracy levels 1 and 4. llama covers the q/k row un-permutation."""
    from specrt.export.tiny import write_gguf

    arch, qtype = request.param
    folder = zoo.checkpoint(f"native-src-{arch}", arch, seed=31)
    path = write_gguf(folder, zoo.root / f"native-{arch}-{qtype}.gguf", quant=qtype)
    key = f"native-{arch}-{qtype}"
    zoo._checkpoints[key] = path
    bundles = {
        "fp32": zoo.bundle(f"{key}-fp32", key, max_seq_len=64),
        1: zoo.bundle(f"{key}-acc1", key, max_seq_len=64, quant="native", accuracy_level=1),
        4: zoo.bundle(f"{key}-acc4", key, max_seq_len=64, quant="native", accuracy_level=4),
        # the same blocks as DequantizeLinear + MatMul (no contrib op), at accuracy level 1
        "qdq": zoo.bundle(f"{key}-qdq", key, max_seq_len=64, quant="native", accuracy_level=1, weights="qdq"),
    }
    return qtype, bundles


def test_native_bundle_computes_with_the_files_own_weights(native_case):
    from specrt import open_bundle
    from specrt.runtime.session import ModelSession

    qtype, bundles = native_case
    m = open_bundle(bundles[1]).manifest
    assert m.quantization.method == "native" and m.quantization.tensors
    tensors = m.quantization.tensors.values()
    assert all(v.startswith(qtype) and v.endswith("(exact)") for v in tensors), m.quantization
    ids = np.random.default_rng(7).integers(0, m.architecture.vocab_size, 40).tolist()
    logits = {name: ModelSession(open_bundle(b)).forward(ids, keep=40).copy() for name, b in bundles.items()}
    scale = np.abs(logits["fp32"]).max()
    # Accuracy level 1: the same weights in fp32 arithmetic, only the summation order differs.
    assert np.abs(logits[1] - logits["fp32"]).max() < 1e-4 * scale
    assert np.abs(logits["qdq"] - logits["fp32"]).max() < 1e-4 * scale
    # Accuracy level 4: int8 activations per block move logits a little; the argmax follows.
    assert np.abs(logits[4] - logits["fp32"]).max() < 0.05 * scale
    assert np.mean(logits[4].argmax(-1) == logits["fp32"].argmax(-1)) >= 0.9


def test_native_needs_a_gguf(zoo, tmp_path):
    from specrt import ExportError
    from specrt.export import ExportOptions, Progress, export_bundle

    zoo.target()  # builds the "target" checkpoint as the rest of the suite knows it
    with pytest.raises(ExportError, match="--quant native carries a GGUF file's own quantized weights"):
        export_bundle(zoo.checkpoint("target"), tmp_path / "x", ExportOptions(quant="native"), Progress(enabled=False))
