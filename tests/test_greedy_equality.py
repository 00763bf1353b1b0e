"""Losslessness, greedy: speculative output equals target-only output token for token."""

from __future__ import annotations

import pytest

import specrt
from specrt import GenerationOptions

PROMPTS = [
    "def fibonacci(n):",
    "import numpy as np\n",
    "The quick brown fox",
    "for i in range(3):\n    print(i)\n",
    "Speculative decoding keeps",
    "x = np.arange(10)",
    "return fibonacci(n - 1)",
    "Caf\u00e9 na\u00efve",
    "print(x.sum())",
    "if n < 2:\n        return n",
    "over the lazy dog.",
    "\u65e5\u672c\u8a9e",
    "unicode text and emoji \U0001f600",
    "def f(x):\n    return x * 2\n\nprint(f(3))",
    "a",
    "   indented",
    "The output unchanged. " * 3,
    "{'key': [1, 2, 3]}",
    "class Node:\n    def __init__(self):",
    "while True:\n    break",
    "# comment\n",
    "1 + 1 = ",
]
K_VALUES = [1, 2, 4, 8, None]  # None: auto, the cost model picks k each round


def drafting_pays(engine: specrt.Engine) -> specrt.Engine:
    """Step costs under which drafting pays (a draft step at a tenth of a target step, verify widths nearly
    free), set through the engine's public tuning: the toy draft really costs about as much as the toy
    target, and measured costs would (rightly) turn auto k off, leaving its cases nothing to compare."""
    from specrt.tuning.costmodel import Policy, Tuning
    from specrt.tuning.profile import CostProfile
    from specrt.tuning.stepcost import StepCosts

    target = CostProfile({}, "", [1], list(range(1, 10)), [[10.0 + 0.2 * (s - 1) for s in range(1, 10)]])
    draft = CostProfile({}, "", [1], [1, 2], [[1.0, 1.1]]) if engine.draft is not None else None
    engine.tuning = Tuning(steps=StepCosts(target, draft, learn=False), policy=Policy(plain_every=None))
    return engine


@pytest.fixture(scope="module")
def engines(zoo):
    target = zoo.target()
    engines = {
        "self": specrt.load(target, target),
        "noisy": specrt.load(target, zoo.noisy_draft()),
        "small": specrt.load(target, zoo.small_draft()),
        "ngram": specrt.load(target, ngram=True),
        "ngram+noisy": specrt.load(target, zoo.noisy_draft(), ngram=True),
        "noisy on the host": specrt.load(target, zoo.noisy_draft(), sampler="host"),  # numpy decisions
    }
    assert all(e.stats["sampler"] == "graph" for name, e in engines.items() if "host" not in name)
    return {name: drafting_pays(e) for name, e in engines.items()}


@pytest.fixture(scope="module")
def reference(engines):
    """Target-only greedy outputs, through the same loop with k = 0."""
    engine = engines["self"]
    options = GenerationOptions(max_new_tokens=40, num_draft_tokens=0, ignore_eos=True)
    return {p: engine.complete(p, options).token_ids for p in PROMPTS}


def test_enough_prompts():
    assert len(PROMPTS) >= 20


@pytest.mark.parametrize("draft", ["self", "noisy", "small", "ngram", "ngram+noisy", "noisy on the host"])
@pytest.mark.parametrize("k", K_VALUES, ids=lambda k: "auto" if k is None else f"k{k}")
def test_speculative_equals_target_only(engines, reference, draft, k):
    engine = engines[draft]
    options = GenerationOptions(max_new_tokens=40, num_draft_tokens=k, ignore_eos=True)
    drafted = accepted = 0
    chained = engine.draft.chained_steps if engine.draft is not None else 0
    for prompt in PROMPTS:
        gen = engine.complete(prompt, options)
        assert gen.token_ids == reference[prompt], f"{draft} draft, k={k}, prompt {prompt!r}"
        assert gen.stats.new_tokens == 40 and gen.finish_reason == "max_new_tokens"
        drafted += gen.stats.drafted
        accepted += gen.stats.accepted
    assert drafted > 0, f"{draft} draft, k={k}: nothing was drafted, so nothing was compared"
    if draft in ("self", "noisy", "small") and k is not None and k >= 2:  # greedy steps chained on the device
        assert engine.draft.chained_steps > chained, f"{draft} draft, k={k}: no draft step was chained"
    if draft == "self":
        assert accepted == drafted  # a draft identical to the target is always right
    elif draft == "small":
        assert accepted < drafted  # an unrelated draft: rejections (all of them, on these toy models)
    else:
        assert 0 < accepted < drafted, (accepted, drafted)  # partial acceptances and rollbacks happened


def test_eos_stops_identically(engines):
    """Without ignore_eos, both paths stop at the same EOS (or both run to the limit)."""
    for prompt in PROMPTS[:8]:
        base = engines["self"].complete(prompt, GenerationOptions(max_new_tokens=60, num_draft_tokens=0))
        spec = engines["noisy"].complete(prompt, GenerationOptions(max_new_tokens=60, num_draft_tokens=4))
        assert spec.token_ids == base.token_ids and spec.finish_reason == base.finish_reason


def _accept_all(logits, drafted):
    return len(drafted), int(logits[len(drafted)].argmax())


def _rollback_one_short(self, n):
    del self.ids[len(self.ids) - max(n - 1, 0) :]  # keeps the first rejected token in the cache


@pytest.mark.parametrize(
    "mutation",
    [
        "accept every draft (ids from the model runs)",
        "accept every draft (sampler graph)",
        "accept every draft (numpy)",
        "roll back one position short",
    ],
)
def test_equality_check_catches_a_broken_loop(engines, reference, monkeypatch, mutation):
    from specrt.decoding import speculative
    from specrt.engine import decide
    from specrt.export.sampler import verify_greedy
    from specrt.runtime.kvcache import Row

    engine = engines["noisy on the host" if "numpy" in mutation else "noisy"]
    if mutation == "accept every draft (numpy)":
        monkeypatch.setattr(speculative, "accept_greedy", _accept_all)
    elif mutation == "accept every draft (ids from the model runs)":
        monkeypatch.setattr(decide, "leading_matches", lambda drafted, target: len(drafted))
    elif mutation == "accept every draft (sampler graph)":  # the greedy rule of bundles from before `top`
        old = engine.decider.sampler.swap("verify_greedy", verify_greedy("accept_all").SerializeToString())
        monkeypatch.setattr(decide.GraphDecider, "top", lambda self, rows, draft: 0)
    else:
        monkeypatch.setattr(Row, "rollback", _rollback_one_short)
    options = GenerationOptions(max_new_tokens=40, num_draft_tokens=4, ignore_eos=True)
    try:
        mismatches = sum(engine.complete(p, options).token_ids != reference[p] for p in PROMPTS)
    finally:
        if mutation == "accept every draft (sampler graph)":
            engine.decider.sampler.swap("verify_greedy", old)
    assert mismatches > 0, f"greedy equality did not notice '{mutation}'"
