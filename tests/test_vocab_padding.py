"""Draft and target vocabularies that differ only in padding rows (Qwen2.5 0.5B's 151,936 against 7B's
152,064): the smaller side exported with `--vocab-size` to the larger's, its extra ids at probability 0.

The tiny pair: a target of 384 rows over a 320-id tokenizer (ids 320..383 are padding the tokenizer never
produces, though the random target gives them real probability) and a 320-row draft of the same tokenizer."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

import specrt
from specrt import GenerationOptions
from specrt.bundle.loading import open_bundle
from specrt.bundle.manifest import PAD_LOGIT
from specrt.errors import ExportError, IncompatibleModelsError
from specrt.export import ExportOptions, Progress, export_bundle
from specrt.runtime.session import ModelSession


@pytest.fixture(scope="module")
def pair(zoo):
    zoo.checkpoint("vocab-384", "qwen2", vocab_size=384, tokenizer_vocab=320, seed=4)
    target = zoo.bundle("vocab-384-target", "vocab-384")
    zoo.small_draft()
    return target, zoo.bundle("small-padded", "small", role="draft", vocab_size=384)


def test_an_unpadded_draft_is_refused_with_the_fix(zoo, pair):
    target, _ = pair
    with pytest.raises(IncompatibleModelsError) as e:
        specrt.load(target, zoo.small_draft())
    message = str(e.value)
    assert "target 384, draft 320" in message and "ids 320..383 are padding" in message
    assert "--role draft --vocab-size 384" in message and "\n" not in message


def test_the_padded_draft_gives_its_padding_ids_probability_zero(zoo, pair):
    _, draft = pair
    arch = open_bundle(draft).manifest.architecture
    assert (arch.vocab_size, arch.padded_from) == (384, 320)
    assert open_bundle(draft).manifest.validation.passed  # the export compared the 320 real ids with PyTorch
    session = ModelSession(open_bundle(draft))
    ids = [5, 17, 300, 319, 350]  # 350: a padding id the target may emit, fed to the draft (a zero embedding)
    logits = session.forward(ids, keep=len(ids))
    assert logits.shape == (len(ids), 384) and np.all(logits[:, 320:] == PAD_LOGIT)
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    assert np.all(probabilities[:, 320:] == 0.0) and np.all(np.isfinite(logits[:, :320]))
    reference = ModelSession(open_bundle(zoo.bundle("small-draft-plain", "small", role="draft")))
    assert np.abs(reference.forward(ids[:4], keep=4) - logits[:4, :320]).max() < 1e-4


def test_speculation_over_the_padded_pair_is_lossless(pair):
    target, draft = pair
    engine = specrt.load(target, draft)
    alone = specrt.load(target)
    drafted = emitted_padding = 0
    for i, prompt in enumerate(["def f(x):", "import os\n", "class A:"]):
        greedy = GenerationOptions(max_new_tokens=24, num_draft_tokens=3, ignore_eos=True)
        gen = engine.generate(prompt, greedy)
        gen.consume()
        assert gen.token_ids == alone.complete(prompt, replace(greedy, num_draft_tokens=0)).token_ids
        drafted += gen.stats.drafted
        # Sampled: the target gives the padding ids real probability here, so they are emitted and fed back
        # to the draft; the round goes on (exactness itself is rejection sampling's, with q = 0 there).
        sampled = GenerationOptions(max_new_tokens=40, num_draft_tokens=3, temperature=1.0, seed=i, ignore_eos=True)
        out = engine.complete(prompt, sampled)
        assert len(out.token_ids) == 40
        emitted_padding += sum(t >= 320 for t in out.token_ids)
    assert drafted > 0 and emitted_padding > 0


def test_padding_that_is_not_padding_is_refused(zoo, tmp_path):
    # A model with fewer rows than its tokenizer has ids: the ids past its rows are tokens, not padding.
    ckpt = zoo.checkpoint("vocab-300", "llama", layers=1, vocab_size=300, tokenizer_vocab=320, seed=3)
    with pytest.raises(ExportError, match="the tokenizer produces id 319, past the model's 300 rows"):
        export_bundle(ckpt, tmp_path / "a", ExportOptions(role="draft", vocab_size=384), Progress(enabled=False))
    with pytest.raises(ExportError, match="below the model's own 320 rows"):
        export_bundle(
            zoo.checkpoint("small", "llama", layers=1, seed=7),
            tmp_path / "b",
            ExportOptions(vocab_size=256),
            Progress(enabled=False),
        )


def test_tokenizers_that_differ_beyond_padding_name_the_first_differing_id(zoo, pair, tmp_path):
    """Special tokens that differ (the same size): refused, naming the id and both tokens."""
    target, _ = pair
    draft = tmp_path / "draft"
    shutil.copytree(zoo.noisy_draft(), draft)
    data = json.loads((draft / "tokenizer.json").read_text())
    special = data["added_tokens"][-1]
    old, special["content"] = special["content"], "<|not_the_target's|>"
    vocab = data["model"]["vocab"]
    vocab[special["content"]] = vocab.pop(old)  # the same id, another token
    (draft / "tokenizer.json").write_text(json.dumps(data))
    _rerecord(draft, "tokenizer.json")
    with pytest.raises(IncompatibleModelsError) as e:
        specrt.load(zoo.target(), draft)
    assert f"differ at id {special['id']}" in str(e.value)
    assert repr(old) in str(e.value) and "<|not_the_target's|>" in str(e.value)


def _rerecord(bundle, name):
    from test_errors import _rerecord as rerecord

    rerecord(bundle, name)


def test_an_int4_draft_pads_alike(zoo, pair):
    target, _ = pair
    zoo.small_draft()
    draft = zoo.bundle("small-padded-int4", "small", role="draft", vocab_size=384, quant="int4", block_size=16)
    logits = ModelSession(open_bundle(draft)).forward([5, 350], keep=2)
    assert np.all(logits[:, 320:] == PAD_LOGIT)
    options = GenerationOptions(max_new_tokens=24, num_draft_tokens=3, ignore_eos=True)
    gen = specrt.load(target, draft).generate("def f(x):", options)
    gen.consume()
    assert gen.stats.drafted > 0
    assert gen.token_ids == specrt.load(target).complete("def f(x):", replace(options, num_draft_tokens=0)).token_ids
