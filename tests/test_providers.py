"""Provider settings and the load-time checks of a GPU session, up to the provider switch (no GPU here: a
fake onnxruntime session stands in for the CUDA provider where one is needed)."""

from __future__ import annotations

import pytest

from specrt.errors import BundleError, OptionsError
from specrt.runtime import providers as P


def test_devices_are_parsed_and_bad_ones_refused():
    assert P.parse_device("cpu") == ("cpu", 0)
    assert P.parse_device("cuda") == ("cuda", 0)
    assert P.parse_device("cuda:3") == ("cuda", 3)
    assert P.parse_device("tensorrt:1") == ("tensorrt", 1)
    for bad in ("gpu", "cuda:", "cuda:x", "cuda:-1", "cpu:1", "trt"):
        with pytest.raises(OptionsError, match="cpu, cuda, cuda:N, tensorrt or tensorrt:N"):
            P.parse_device(bad)


def test_cuda_provider_options():
    """The device id, the arena grown by what is asked for, cuDNN off, TF32 off unless asked for; the CPU
    provider behind it; nothing but the CPU provider for the CPU."""
    assert P.provider_list("cpu") == [(P.CPU, {})]
    (name, options), cpu = P.provider_list("cuda", 2)
    assert name == P.CUDA and cpu == (P.CPU, {})
    assert options == {
        "device_id": "2",
        "arena_extend_strategy": "kSameAsRequested",
        "use_tf32": "0",
        "enable_cudnn": "0",
    }
    assert P.provider_list("cuda", 0, tf32=True)[0][1]["use_tf32"] == "1"
    # An onnxruntime that does not know an optional option: it is dropped, nothing else.
    fewer = P.without_option(P.provider_list("cuda"), "Unknown provider option: 'enable_cudnn'.")
    assert "enable_cudnn" not in fewer[0][1] and fewer[0][1]["use_tf32"] == "0"
    assert P.without_option(P.provider_list("cuda"), "Invalid device ID: 7") is None


def test_compute_nodes_on_the_cpu_are_found(zoo):
    """Node placements recorded by ONNX Runtime: on a CPU session every node is on the CPU provider, which
    for a GPU session would be the model's arithmetic falling back (matrix products, attention, norms, the KV
    update), while shape computations may stay there."""
    import onnxruntime as ort

    from specrt.bundle.loading import open_bundle

    so = ort.SessionOptions()
    for key, value in P.session_entries("cuda").items():
        so.add_session_config_entry(key, value)
    session = ort.InferenceSession(str(open_bundle(zoo.target()).model_path), so, providers=[P.CPU])
    placed = P.placements(session)
    assert placed and all(provider == P.CPU for provider, _, _ in placed)
    fallen = P.misplaced(placed, "cuda")
    kinds = {entry.split()[0] for entry in fallen}
    assert {"MatMul", "Attention", "RMSNormalization", "TensorScatter"} <= kinds
    assert not kinds & {"Shape", "Gather", "Concat", "Unsqueeze", "Range"}
    assert P.misplaced(placed, "cpu") == []


class _FakeOrt:
    """onnxruntime as a CUDA build would look from here: the CUDA provider listed, sessions made by `make`."""

    def __init__(self, monkeypatch, make):
        import onnxruntime as ort

        self.calls = []
        real = ort.InferenceSession

        def session(model, so, providers):
            self.calls.append(providers)
            return make(len(self.calls), lambda: real(model, so, providers=[P.CPU]))

        monkeypatch.setattr(ort, "get_available_providers", lambda: [P.CUDA, P.CPU])
        monkeypatch.setattr(ort, "InferenceSession", session)


def _load_on_cuda(zoo):
    from specrt.bundle.loading import open_bundle
    from specrt.runtime.session import ModelSession, SessionOptions

    return ModelSession(open_bundle(zoo.target()), SessionOptions(device="cuda", device_id=1), rows=2)


def test_a_gpu_out_of_memory_at_load_is_a_bundle_error_with_the_sizes(zoo, monkeypatch):
    """A CUDA provider that refuses an option this specrt passes is asked again without it; running out of
    device memory is one line naming the device and the sizes, and the way out."""

    def make(call, real):
        if call == 1:
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Unknown provider option: 'enable_cudnn'.")
        raise RuntimeError("CUDA failure 2: out of memory ; GPU=1 ; expr=cudaMalloc(&p, size);")

    fake = _FakeOrt(monkeypatch, make)
    with pytest.raises(BundleError) as e:
        _load_on_cuda(zoo)
    message = str(e.value)
    assert "\n" not in message and "cuda:1 ran out of memory" in message and "GiB of KV slots for 2 rows" in message
    assert [c[0][1].get("enable_cudnn") for c in fake.calls] == ["0", None]
    assert all(c[0][1]["device_id"] == "1" and c[0][1]["use_tf32"] == "0" for c in fake.calls)


def test_a_gpu_session_with_compute_on_the_cpu_is_refused(zoo, monkeypatch):
    """Every node placed on the CPU provider (what a CUDA build does with nodes it has no kernel for): the
    load fails naming the nodes, instead of running with copies across the bus every step."""
    _FakeOrt(monkeypatch, lambda call, real: real())
    with pytest.raises(BundleError, match=r"compute nodes would run on the CPU beside cuda:1 \(") as e:
        _load_on_cuda(zoo)
    assert "--device cpu" in str(e.value) and "\n" not in str(e.value)


def test_sampler_graphs_with_compute_on_the_cpu_are_refused(zoo, monkeypatch):
    """The sampler graphs get the same placement check as the model graphs: on the stand-in every node is on
    the CPU provider, so a GPU load fails naming them instead of copying logits across the bus every run."""
    from specrt.bundle.loading import open_bundle
    from specrt.runtime.buffers import Transfers
    from specrt.runtime.sampler import GraphSampler
    from specrt.runtime.session import SessionOptions

    _FakeOrt(monkeypatch, lambda call, real: real())
    with pytest.raises(BundleError, match=r"sampler graph .*pick_greedy.onnx: \d+ compute nodes would run on the CPU"):
        GraphSampler(open_bundle(zoo.target()), SessionOptions(device="cuda"), 2, Transfers())
