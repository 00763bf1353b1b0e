"""Opt-in checks on the real Qwen2.5-Coder pair (pytest -m real): needs the GGUFs from
scripts/fetch_models.py and the bundles from scripts/demo.sh; skipped when they are absent.
About 4 minutes on 2 cores (most of it fp32 target-only decoding and loading the GGUF tokenizers)."""

from __future__ import annotations

from pathlib import Path

import pytest

import specrt
from specrt import GenerationOptions

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parent.parent
TARGET_GGUF = ROOT / "models/qwen2.5-coder-1.5b-instruct.gguf"
TARGET = ROOT / "engines/qwen2.5-coder-1.5b-fp32"
TARGET_INT4 = ROOT / "engines/qwen2.5-coder-1.5b-int4"
DRAFT = ROOT / "engines/qwen2.5-coder-0.5b-int4"
PROMPTS = [
    ("def merge_sort(items):\n", False),
    ("Once upon a time, in a small village by the sea, there lived", False),
    ("Write a Python function that checks whether a string is a palindrome.", True),
    ("Explain what a hash table is.", True),
]


def need(*paths: Path) -> None:
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}: run scripts/demo.sh first")


@pytest.fixture(scope="module")
def engine():
    need(TARGET, DRAFT)
    return specrt.load(TARGET, DRAFT, ngram=True)


@pytest.mark.parametrize("k", [4, None], ids=["k4", "auto"])
def test_greedy_equality_on_the_real_pair(engine, k):
    accepted = drafted = 0
    for text, chat in PROMPTS:
        base = engine.complete(text, GenerationOptions(max_new_tokens=48, num_draft_tokens=0), chat=chat)
        spec = engine.complete(text, GenerationOptions(max_new_tokens=48, num_draft_tokens=k), chat=chat)
        assert spec.token_ids == base.token_ids, text
        accepted, drafted = accepted + spec.stats.accepted, drafted + spec.stats.drafted
    assert drafted > 0 and accepted / drafted > 0.5  # a real, same-family draft agrees most of the time


def test_real_tokenizer_encodes_like_transformers():
    need(TARGET, TARGET_GGUF)
    from transformers import AutoTokenizer

    ours = specrt.open_bundle(TARGET).load_tokenizer()
    theirs = AutoTokenizer.from_pretrained(TARGET_GGUF.parent, gguf_file=TARGET_GGUF.name)
    strings = [text for text, _ in PROMPTS] + [
        "  indented\n\ttabs and trailing spaces   ",
        "Unicode: caf\u00e9, na\u00efve, \u65e5\u672c\u8a9e, \U0001f600",
        "<|im_start|>system\nYou are Qwen.<|im_end|>\n",
        "x = [i ** 2 for i in range(10) if i % 3 == 0]  # comprehension",
    ]
    for s in strings:
        assert ours.encode(s) == theirs.encode(s), s


def test_int4_target_divergences_are_near_ties():
    """int4 (accuracy level 4) targets are not bit-stable between 1-token and (k+1)-token passes: any
    greedy divergence must sit at a near-tie of the target, never at a clear choice."""
    need(TARGET_INT4, DRAFT)
    from specrt.decoding.divergence import NEAR_TIE, divergence

    engine = specrt.load(TARGET_INT4, DRAFT)
    for text, chat in PROMPTS:
        ids = engine.encode(text, chat=chat)
        base = engine.complete(ids, GenerationOptions(max_new_tokens=48, num_draft_tokens=0)).token_ids
        spec = engine.complete(ids, GenerationOptions(max_new_tokens=48, num_draft_tokens=4)).token_ids
        if spec != base:
            assert divergence(engine.target, ids, base, spec)["top2_margin"] < NEAR_TIE, text


def test_qwen_vocabularies_that_differ_only_in_padding():
    """Qwen2.5 0.5B-3B carry 151,936 logit rows, 7B-72B 152,064 over the same tokenizer: the shapes alone (no
    7B weights): the pair check names the padding and the fix, and padding the 0.5B's vocabulary is accepted."""
    from dataclasses import replace

    from specrt.bundle.loading import check_pair, open_bundle
    from specrt.export.pipeline import padded

    need(DRAFT)
    draft = open_bundle(DRAFT)
    arch = draft.manifest.architecture
    assert arch.vocab_size == 151_936
    seven_b = replace(draft, manifest=replace(draft.manifest, architecture=replace(arch, vocab_size=152_064)))
    with pytest.raises(specrt.IncompatibleModelsError) as e:
        check_pair(seven_b, draft)
    assert "ids 151936..152063 are padding" in str(e.value) and "--vocab-size 152064" in str(e.value)
    assert "highest id is 151935" in str(e.value)  # the GGUF names its own padding rows [PAD151665]...
    grown = padded(arch, 152_064, draft.tokenizer_path)
    assert (grown.vocab_size, grown.padded_from) == (152_064, 151_936)
    check_pair(seven_b, replace(draft, manifest=replace(draft.manifest, architecture=grown)))


SMOLLM2 = ROOT / "models/smollm2-135m-instruct.gguf"


def test_smollm2_real_weights_export_and_speculate(tmp_path):
    """SmolLM2-135M-Instruct (a llama: tied embeddings, 9 query heads over 3 KV heads, rope base 1e5) from
    its GGUF: an fp32 bundle checked against transformers at export, an int4 draft of the same weights, and
    speculative output equal to target-only output with drafts checked."""
    from specrt.export import ExportOptions, Progress, export_bundle

    need(SMOLLM2)
    target, draft = tmp_path / "target", tmp_path / "draft"
    m = export_bundle(SMOLLM2, target, ExportOptions(quant="none", max_seq_len=512), Progress(enabled=False))
    assert m.architecture.model_type == "llama" and m.architecture.tie_word_embeddings
    assert m.validation.passed and m.validation.top1_agreement == 1.0
    export_bundle(SMOLLM2, draft, ExportOptions.for_role("draft", max_seq_len=512), Progress(enabled=False))
    engine = specrt.load(target, draft)
    drafted = accepted = 0
    for prompt, chat in PROMPTS:
        options = GenerationOptions(max_new_tokens=32, num_draft_tokens=3, ignore_eos=True)
        spec = engine.generate(prompt, options, chat=chat)
        spec.consume()
        plain = engine.complete(
            prompt, GenerationOptions(max_new_tokens=32, num_draft_tokens=0, ignore_eos=True), chat=chat
        )
        assert spec.token_ids == plain.token_ids, prompt
        drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    assert 0 < accepted < drafted


GEMMA3 = ROOT / "models/gemma-3-270m.gguf"


def test_gemma3_real_weights_export_and_speculate(tmp_path):
    """Gemma 3 270M (base) from its GGUF: an fp32 bundle checked against transformers at export; a prompt
    longer than its sliding window (512) agrees with transformers where the local layers see only part of
    it; an int4 draft of the same weights and speculative output equal to target-only output."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from specrt import open_bundle
    from specrt.export import ExportOptions, Progress, export_bundle
    from specrt.runtime.session import ModelSession

    need(GEMMA3)
    target, draft = tmp_path / "target", tmp_path / "draft"
    m = export_bundle(GEMMA3, target, ExportOptions(quant="none", max_seq_len=640), Progress(enabled=False))
    assert m.architecture.model_type == "gemma3_text" and m.architecture.sliding_window == 512
    assert m.validation.passed and m.validation.top1_agreement == 1.0

    ids = np.random.default_rng(0).integers(0, 262_144, 600).tolist()  # past the window of 512
    got = ModelSession(open_bundle(target)).forward(ids, keep=8)
    model = AutoModelForCausalLM.from_pretrained(GEMMA3.parent, gguf_file=GEMMA3.name, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0, -8:].numpy()
    del model
    assert np.abs(got - ref).max() < 1e-3 and (got.argmax(-1) == ref.argmax(-1)).all(), np.abs(got - ref).max()

    export_bundle(GEMMA3, draft, ExportOptions.for_role("draft", max_seq_len=640), Progress(enabled=False))
    engine = specrt.load(target, draft)
    drafted = accepted = 0
    for prompt in ("def fibonacci(n):", "The capital of France is", "Once upon a time,"):
        plain = engine.complete(prompt, GenerationOptions(max_new_tokens=32, num_draft_tokens=0, ignore_eos=True))
        spec = engine.complete(prompt, GenerationOptions(max_new_tokens=32, num_draft_tokens=3, ignore_eos=True))
        assert spec.token_ids == plain.token_ids, prompt
        drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    assert 0 < accepted < drafted
