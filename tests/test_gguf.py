"""GGUF input: a tiny GGUF written in the test, exported, compared with transformers' GGUF loading."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from specrt import open_bundle
from specrt.export.tiny import write_gguf
from specrt.runtime.session import ModelSession

STRINGS = [
    "def fibonacci(n):\n    return n",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and\ttabs\n\nnewlines",
    "Caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f600",
    "<|im_start|>user\nhi<|im_end|>\n",
    "x=1;y=2;print(x+y)  # 3",
    "",
    "12345 678.9e-3",
]


# Each architecture with the settings transformers' GGUF reader restores (it reads a fixed list of keys and
# takes its config's defaults for the rest: Phi-3's window, Gemma's soft caps, query scale and layer pattern).
GEMMA = dict(head_dim=256, query_pre_attn_scalar=256, sliding_window=24, tie=True)
CASES = {
    "qwen2": {},
    "llama": {},
    "phi3": dict(sliding_window=None),
    "gemma2": dict(GEMMA, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "gemma3_text": dict(
        GEMMA,
        layer_types=["sliding_attention"] * 2,
        final_logit_softcapping=None,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        },
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def gguf_case(request, zoo):
    arch = request.param
    folder = zoo.checkpoint(f"gguf-src-{arch}", arch, seed=21, **CASES[arch])
    path = write_gguf(folder, zoo.root / f"tiny-{arch}.gguf")
    zoo._checkpoints[f"gguf-{arch}"] = path
    return arch, folder, path, zoo.bundle(f"gguf-{arch}", f"gguf-{arch}", max_seq_len=64)


def test_gguf_bundle_matches_transformers_gguf_loading(gguf_case):
    arch, _, path, bundle = gguf_case
    m = open_bundle(bundle).manifest
    assert m.source.format == "gguf" and m.source.weight_files == [path.name]
    assert m.architecture.model_type == arch
    assert m.validation.passed and m.validation.max_abs_diff < 1e-4 and m.validation.top1_agreement == 1.0


def test_gguf_tokenizer_encodes_like_transformers(gguf_case):
    _, folder, path, bundle = gguf_case
    ours = open_bundle(bundle).load_tokenizer()
    theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    original = AutoTokenizer.from_pretrained(folder)
    for s in STRINGS:
        ids = ours.encode(s)
        assert ids == theirs.encode(s), s
        assert ids == original.encode(s), s  # the GGUF round trip kept the tokenizer intact
        assert ours.decode(ids, skip_special_tokens=False) == s
    assert ours.eos_token_ids[0] == theirs.eos_token_id
    assert ours.chat_template == original.chat_template


def test_gguf_bundle_tracks_the_original_checkpoint(gguf_case):
    """Q8_0 storage moves logits a little; the argmax must still follow the float model."""
    import torch
    from transformers import AutoModelForCausalLM

    _, folder, _, bundle = gguf_case
    session = ModelSession(open_bundle(bundle))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = np.random.default_rng(5).integers(0, session.vocab_size, 40).tolist()
    got = session.forward(ids, keep=40)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    assert np.mean(got.argmax(-1) == ref.argmax(-1)) >= 0.9
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()


def test_settings_transformers_gguf_reader_drops_are_refused():
    """A GGUF whose rope scaling, or whose Gemma 3 query scale, transformers' GGUF loader would leave out is
    refused (the export would build another model) with the reason; what the loader reads is accepted."""
    from types import SimpleNamespace

    from specrt.export.gguf import dropped_setting

    gemma = lambda **kw: SimpleNamespace(  # noqa: E731 - a Gemma 3 config as transformers builds it from a GGUF
        rope_parameters={"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}},
        query_pre_attn_scalar=256,
        head_dim=kw.get("head_dim", 256),
    )
    scaled = {"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0}
    assert "rope scaling (linear, factor 8.0)" in dropped_setting("gemma3", scaled, gemma())
    assert "query_pre_attn_scalar to 256" in dropped_setting("gemma3", {}, gemma(head_dim=128))
    assert dropped_setting("gemma3", {}, gemma()) is None  # Gemma 3 270M-12B without scaling
    assert dropped_setting("gemma3", {"gemma3.rope.scaling.type": "none"}, gemma()) is None
    llama = SimpleNamespace(rope_parameters={"rope_type": "linear", "factor": 2.0})
    assert dropped_setting("llama", {"llama.rope.scaling.type": "linear"}, llama) is None  # read: fine
