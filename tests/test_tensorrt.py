"""TensorRT, up to the provider switch (no TensorRT here): the exporter's record of what TensorRT's ONNX parser
would refuse, `specrt inspect`, the refusal at load, the provider options (caches per machine, optimisation
profiles), and the TensorRT-ready graph's parity on the CPU provider."""

from __future__ import annotations

import pytest
from test_errors import _edit_manifest, assert_one_line_error, run_cli
from test_providers import _FakeOrt

import specrt
from specrt.bundle.loading import open_bundle
from specrt.errors import BundleError, OptionsError
from specrt.runtime import providers as P
from specrt.runtime import tensorrt as trt

MIN_OPT_MAX = ("min", "opt", "max")
READY = dict(quant="int4", block_size=128, lm_head="int4")  # symmetric blocks of 128: what TensorRT takes


@pytest.fixture(scope="module")
def ready_int4(zoo):
    zoo.target()
    return zoo.bundle("target-trt-int4", "target", **READY)


def test_the_manifest_says_what_tensorrt_would_refuse(zoo, ready_int4):
    assert open_bundle(zoo.target()).manifest.tensorrt == []  # fp32, standard graph
    assert open_bundle(ready_int4).manifest.tensorrt == []
    refused = {
        "target-trt-int4-32-asym": (
            dict(quant="int4", block_size=32, symmetric=False),
            ["zero points", "blocks of 32"],
        ),
        "target-trt-int8": (dict(quant="int8"), ["block-wise int8"]),
        "target-trt-gqa": (dict(graph="gqa"), ["com.microsoft.GroupQueryAttention"]),
        "target-trt-nbits": (dict(quant="int4", block_size=128, weights="nbits"), ["com.microsoft.MatMulNBits"]),
    }
    for name, (options, needles) in refused.items():
        reasons = open_bundle(zoo.bundle(name, "target", **options)).manifest.tensorrt
        assert len(reasons) == len(needles), reasons
        for needle, reason in zip(needles, reasons, strict=True):
            assert needle in reason, reasons


def test_the_check_reads_the_graph(zoo):
    """A graph from before the exporter wrote axis -2 (the same scatter, for 4-D buffers) is refused."""
    import onnx

    from specrt.export.tensorrt import check

    model = onnx.load(str(open_bundle(zoo.target()).model_path), load_external_data=False)
    assert check(model) == []
    scatters = [n for n in model.graph.node if n.op_type == "TensorScatter"]
    for node in scatters:
        next(a for a in node.attribute if a.name == "axis").i = 2
    assert check(model) == [
        f"TensorScatter with axis 2: TensorRT's KV-cache update takes axis -2 only ({len(scatters)} nodes)"
    ]


def test_inspect_says_whether_a_bundle_is_tensorrt_ready(capsys, zoo, tmp_path):
    import shutil

    from specrt.cli import main

    main(["inspect", str(zoo.target())])
    assert "TensorRT-ready yes (--device tensorrt)" in capsys.readouterr().out
    main(["inspect", str(zoo.bundle("target-trt-gqa", "target", graph="gqa"))])
    assert "TensorRT-ready no: com.microsoft.GroupQueryAttention" in capsys.readouterr().out
    old = shutil.copytree(zoo.target(), tmp_path / "old")
    _edit_manifest(old, lambda d: d.pop("tensorrt"))
    main(["inspect", str(old)])
    assert "TensorRT-ready unknown (exported before the check" in capsys.readouterr().out


def test_a_bundle_tensorrt_cannot_take_is_refused_at_load_with_the_fix(capsys, zoo, tmp_path):
    import shutil

    gqa = zoo.bundle("target-trt-gqa", "target", graph="gqa")
    with pytest.raises(BundleError) as e:
        specrt.load(gqa, device="tensorrt")
    message = str(e.value)
    assert "\n" not in message and "TensorRT cannot take this graph (com.microsoft.GroupQueryAttention" in message
    assert "--graph standard --weights qdq --symmetric" in message
    old = shutil.copytree(zoo.target(), tmp_path / "old")
    _edit_manifest(old, lambda d: d.pop("tensorrt"))
    with pytest.raises(BundleError, match="exported before specrt checked graphs for TensorRT; re-export with"):
        specrt.load(old, device="tensorrt")
    # A ready bundle gets as far as the provider: this onnxruntime has none.
    with pytest.raises(OptionsError, match="device 'tensorrt' needs TensorrtExecutionProvider, which this onnxruntime"):
        specrt.load(zoo.target(), device="tensorrt:1")
    code, _, err = run_cli(capsys, "generate", "--target", gqa, "--device", "tensorrt", "--prompt", "x")
    assert_one_line_error(code, err, "TensorRT cannot take this graph")


def test_provider_options(zoo, ready_int4, tmp_path):
    bundle = open_bundle(ready_int4)
    a = bundle.manifest.architecture
    cache = trt.cache_folder(bundle, 0, gpu="NVIDIA H200", version="10.15.1.29")
    assert cache == ready_int4 / "tensorrt" / "nvidia-h200-trt10.15.1.29"
    o = trt.options(bundle, 1, rows=8, cache=cache)
    assert o["device_id"] == "1" and o["trt_cuda_graph_enable"] == "1"
    assert (o["trt_fp16_enable"], o["trt_bf16_enable"]) == ("0", "0")
    assert o["trt_engine_cache_path"] == o["trt_timing_cache_path"] == str(cache)
    assert o["trt_engine_cache_enable"] == o["trt_timing_cache_enable"] == "1"
    # Profiles: prefill chunks at one row, then batch buckets 1, 2, 4, 8 at widths 1..65.
    ids = {
        k: [e for e in o[f"trt_profile_{k}_shapes"].split(",") if e.startswith("input_ids:")]
        for k in ("min", "opt", "max")
    }
    assert ids["min"] == ["input_ids:1x66", "input_ids:1x1", "input_ids:2x1", "input_ids:3x1", "input_ids:5x1"]
    assert ids["opt"] == ["input_ids:1x128", "input_ids:1x1", "input_ids:2x1", "input_ids:4x1", "input_ids:8x1"]
    assert ids["max"] == ["input_ids:1x128", "input_ids:1x65", "input_ids:2x65", "input_ids:4x65", "input_ids:8x65"]
    kv = f"{a.num_kv_heads}x{bundle.manifest.max_seq_len}x{a.head_dim}"
    assert f"past_key_values.0.key:8x{kv}" in o["trt_profile_max_shapes"].split(",")
    assert o["trt_profile_max_shapes"].count(f"x{kv}") == 5 * 2 * a.num_layers
    assert "logits_rows:8x520" not in o["trt_profile_max_shapes"] and "logits_rows:520" in o["trt_profile_max_shapes"]
    assert trt.buckets(1) == [1] and trt.buckets(6) == [1, 2, 4, 6]
    fp16 = open_bundle(zoo.bundle("target-trt-fp16", "target", dtype="fp16"))
    assert trt.options(fp16, 0, rows=1, cache=cache)["trt_fp16_enable"] == "1"
    # The GPU's model from the driver's files (a stand-in folder here).
    (tmp_path / "0000:01:00.0").mkdir()
    (tmp_path / "0000:01:00.0/information").write_text("Model: \t NVIDIA H200\nIRQ: 42\n")
    assert trt.gpu_model(0, tmp_path) == "NVIDIA H200" and trt.gpu_model(1, tmp_path) == "unknown-gpu"


def test_a_tensorrt_session_is_asked_for_with_its_options(zoo, ready_int4, monkeypatch):
    """TensorRT first with the bundle's options, CUDA behind it (for what TensorRT does not take), then the CPU
    (the placement check refuses compute there); the sampler graphs on CUDA alone."""
    import onnxruntime as ort

    fake = _FakeOrt(monkeypatch, lambda call, real: real())
    monkeypatch.setattr(ort, "get_available_providers", lambda: [P.TENSORRT, P.CUDA, P.CPU])
    from specrt.runtime.session import ModelSession, SessionOptions

    with pytest.raises(BundleError, match="compute nodes would run on the CPU beside cuda:0"):  # the stand-in's
        ModelSession(open_bundle(ready_int4), SessionOptions(device="cuda", tensorrt=True), rows=4)
    (name, options), (cuda, _), (cpu, _) = fake.calls[0]
    assert (name, cuda, cpu) == (P.TENSORRT, P.CUDA, P.CPU)
    assert options == trt.options(open_bundle(ready_int4), 0, rows=4)
    with pytest.raises(OptionsError, match="tensorrt=True needs device 'cuda'"):
        SessionOptions(tensorrt=True)


def test_the_tensorrt_ready_graphs_run_on_the_cpu_with_parity(zoo, ready_int4):
    """The graphs TensorRT would take, on the CPU provider. fp32: the export's validation against PyTorch,
    gated by its tolerance. int4 in symmetric blocks of 128: the same logits as the same blocks in
    MatMulNBits form (the kernel the CPU has always run), and speculative greedy output equal to target-only."""
    import numpy as np

    from specrt.runtime.session import ModelSession

    v = open_bundle(zoo.target()).manifest.validation
    assert v.tolerance is not None and v.passed and v.top1_agreement == 1.0, v
    nbits = zoo.bundle("target-trt-nbits", "target", quant="int4", block_size=128, lm_head="int4", weights="nbits")
    ids = [[5, 17, 2, 99, 41, 8], [7, 3]]
    logits = []
    for bundle in (ready_int4, nbits):
        session = ModelSession(open_bundle(bundle), rows=2)
        logits.append(np.concatenate(session.run([0, 1], ids, [6, 2])))
    assert np.abs(logits[0] - logits[1]).max() < 1e-3
    engine = specrt.load(ready_int4, ready_int4)  # itself as the draft: drafts accepted
    plain = engine.complete("def f(x):", specrt.GenerationOptions(max_new_tokens=16, num_draft_tokens=0))
    spec = engine.complete("def f(x):", specrt.GenerationOptions(max_new_tokens=16, num_draft_tokens=3))
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0
