"""Hostile input, generated: manifests, options and prompts give a result or a one-line SpecrtError, never
another exception, and a generation that failed leaves the engine as good as new.

Property-based (hypothesis): each strategy mixes valid values with the ones that break naive code (NaN,
infinities, huge integers, wrong types, lone surrogates, control characters, out-of-range token ids).
"""

from __future__ import annotations

import copy
import json
import math
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import specrt
from specrt import GenerationOptions, Manifest, SpecrtError

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
FINISH = {"eos", "stop", "max_new_tokens", "length"}
PROBE = "def fibonacci(n):"

WEIRD_NUMBERS = st.sampled_from(
    [0, -1, 1, 2, 7, 2**31, 2**63, 10**30, -(10**30), 0.5, -0.0, 1e-300, 5e-324, 1e300, math.nan, math.inf, -math.inf]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | WEIRD_NUMBERS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def assert_clean(error: SpecrtError) -> None:
    message = str(error)
    assert message and "\n" not in message and "Traceback" not in message, message


def _get(node, path):
    for key in path:
        node = node[key]
    return node


def _paths(node, prefix=()):
    """Every key path into a JSON tree (dict keys and list indices), parents before children."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key))


@st.composite
def mutated(draw, base: dict, actions=("delete", "replace", "number", "nudge"), most: int = 3) -> dict:
    """A manifest with one to `most` fields deleted, retyped, or set to an awkward or plausible number."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, most))):
        paths = list(_paths(data))
        if set(actions) <= {"number", "nudge"}:  # numbers only: the manifest still parses more often
            paths = [
                p for p in paths if isinstance(_get(data, p), (int, float)) and not isinstance(_get(data, p), bool)
            ]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(actions))
        old = parent[path[-1]]
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = draw(JSON_VALUES)
        elif action == "number":
            parent[path[-1]] = draw(WEIRD_NUMBERS)
        elif isinstance(old, (int, float)) and not isinstance(old, bool):  # a plausible but wrong value
            parent[path[-1]] = draw(st.sampled_from([old + 1, old - 1, old * 2, -old, old // 2 if old else 1]))
    if "replace" in actions and draw(st.booleans()):
        data["schema_version"] = draw(st.one_of(st.just(specrt.SCHEMA_VERSION), WEIRD_NUMBERS, JSON_VALUES))
    return data


@pytest.fixture(scope="module")
def base_manifest(zoo) -> dict:
    return Manifest.read(zoo.noisy_draft()).to_dict()


@settings(max_examples=400, **SETTINGS)
@given(data=st.data())
def test_any_manifest_parses_or_is_refused_in_one_line(base_manifest, data):
    raw = data.draw(mutated(base_manifest))
    try:
        Manifest.from_dict(raw)
    except SpecrtError as e:
        assert_clean(e)


@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_any_manifest_loads_or_is_refused_in_one_line(zoo, base_manifest, tmp_path_factory, data):
    """Through the whole load (files, ONNX Runtime, KV buffers) and a short generation."""
    bundle = tmp_path_factory.getbasetemp() / "hostile-manifest"
    if not bundle.exists():
        shutil.copytree(zoo.noisy_draft(), bundle)
    raw = data.draw(st.one_of(mutated(base_manifest), mutated(base_manifest, ("number", "nudge"), most=1)))
    (bundle / "manifest.json").write_text(json.dumps(raw))
    try:
        engine = specrt.load(bundle)
        gen = engine.complete(PROBE, GenerationOptions(max_new_tokens=3))
    except SpecrtError as e:
        assert_clean(e)
        event(f"refused: {type(e).__name__}")
    else:
        assert gen.finish_reason in FINISH
        event("loaded and generated")


# Options: each field valid (7 times in 10) or hostile.
def _field(valid):
    return st.integers(0, 9).flatmap(lambda i: valid if i < 7 else st.one_of(WEIRD_NUMBERS, JSON_VALUES))


OPTION_FIELDS = {
    "max_new_tokens": _field(st.integers(1, 40)),
    "temperature": _field(st.sampled_from([0.0, 0.3, 1.0, 1e-9, 50.0])),
    "top_k": _field(st.integers(0, 400)),
    "top_p": _field(st.floats(0.01, 1.0)),
    "seed": _field(st.integers(0, 2**70)),
    "num_draft_tokens": _field(st.none() | st.integers(0, 64)),
    "max_draft_tokens": _field(st.integers(1, 64)),
    "stop": _field(st.lists(st.text(min_size=1, max_size=3), max_size=2) | st.text(max_size=3)),
    "ignore_eos": _field(st.booleans()),
}


@st.composite
def option_kwargs(draw) -> dict:
    names = draw(st.lists(st.sampled_from(sorted(OPTION_FIELDS)), unique=True))
    return {name: draw(OPTION_FIELDS[name]) for name in names}


@settings(max_examples=500, **SETTINGS)
@given(kw=option_kwargs())
def test_any_options_build_or_are_refused_in_one_line(kw):
    try:
        options = GenerationOptions(**kw)
    except SpecrtError as e:
        assert_clean(e)
        return
    assert options.max_new_tokens >= 1 and math.isfinite(options.temperature) and 0 < options.top_p <= 1
    assert isinstance(options.stop, tuple) and isinstance(options.ignore_eos, bool)


TOKEN_IDS = st.lists(
    st.one_of(
        st.integers(0, 319),
        st.integers(-5, 400),
        st.sampled_from([2**40, -(2**63), np.int64(5), np.int32(7), True, 3.0, "7", None]),
    ),
    max_size=40,
)
TEXT = st.one_of(
    st.text(max_size=60),  # includes control characters
    st.text(st.characters(categories=["Cs", "Cc", "Zs", "Ll"]), max_size=20),  # lone surrogates
    st.sampled_from(["", "def f(x):", "x" * 3000, "<|im_end|><|im_start|>", "\x00\x1b[31m"]),
)


@pytest.fixture(scope="module")
def engines(zoo):
    """An engine that takes the hostile traffic, and what a fresh engine answers to the probes."""
    engine = specrt.load(zoo.target(), zoo.noisy_draft(), ngram=True)
    fresh = specrt.load(zoo.target(), zoo.noisy_draft(), ngram=True)
    return engine, probes(fresh)


def probes(engine) -> tuple[list[int], list[int]]:
    greedy = engine.complete(PROBE, GenerationOptions(max_new_tokens=24)).token_ids
    sampled = engine.complete(PROBE, GenerationOptions(max_new_tokens=24, temperature=0.8, seed=3, num_draft_tokens=3))
    return greedy, sampled.token_ids


@settings(max_examples=150, **SETTINGS)
@given(kw=option_kwargs(), prompt=st.one_of(TEXT, TOKEN_IDS), chat=st.booleans())
@example(kw={"temperature": 0.3, "top_k": 2**63}, prompt="0", chat=False)  # found: overflowed the graphs' int64
def test_any_prompt_and_options_give_a_result_or_one_line_and_leave_the_engine_intact(engines, kw, prompt, chat):
    engine, expected = engines
    try:
        options = GenerationOptions(**kw)
        gen = engine.complete(prompt, options, chat=chat)
    except SpecrtError as e:
        assert_clean(e)
        event(f"refused: {type(e).__name__}")
    else:
        event(f"generated: {gen.finish_reason}")
        assert gen.finish_reason in FINISH
        assert len(gen.token_ids) <= options.max_new_tokens
        assert all(0 <= t < engine.target.vocab_size for t in gen.token_ids)
    assert probes(engine) == expected


class Fault(Exception):
    """Stands for anything that can go wrong mid-generation: a failed run, a bug, an interrupt."""


@settings(max_examples=60, **SETTINGS)
@given(
    where=st.sampled_from(["target", "draft", "consumer"]),
    after=st.integers(0, 12),
    sampled=st.booleans(),
    k=st.sampled_from([None, 1, 4]),
)
def test_a_generation_that_raised_leaves_the_engine_as_good_as_new(engines, where, after, sampled, k):
    engine, expected = engines
    calls = {"n": 0}

    def failing(forward):
        def run(*args, **kw):
            calls["n"] += 1
            if calls["n"] > after:
                raise Fault(f"injected after {after} forwards")
            return forward(*args, **kw)

        return run

    # The fault is raised by ONNX Runtime's run itself, as a failed run would be.
    session = {"target": engine.target, "draft": engine.draft}.get(where)
    if session is not None:
        session.session.run_with_iobinding = failing(session.session.run_with_iobinding)
    options = GenerationOptions(max_new_tokens=30, temperature=0.9 if sampled else 0.0, seed=1, num_draft_tokens=k)
    try:
        # The probe's prompt: what the failed generation left cached is what the probe reuses.
        for piece in engine.generate(PROBE, options):
            if where == "consumer" and piece:
                calls["n"] += 1
                if calls["n"] > after:
                    raise Fault("the caller's own code failed while streaming")
    except Fault:
        pass
    finally:
        if session is not None:
            del session.session.run_with_iobinding  # the class's method again
    assert probes(engine) == expected
