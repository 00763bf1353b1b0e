"""Losslessness, sampled: speculative sampling reproduces the target's distribution exactly.

Tiny vocabulary (8 tokens), a target and a noisy draft that disagrees with it often. We compute the exact
target distribution of the continuation by enumerating every prefix through the target session, sample
many continuations speculatively (k = 2, so drafts, acceptances, rejections and the bonus token all
occur), and compare empirical with exact frequencies.

Bound (Bretagnolle-Huber-Carol): for N samples of a distribution with K outcomes,
P(||p_hat - p||_1 >= eps) <= 2^K exp(-N eps^2 / 2), so eps = sqrt(2 (K ln 2 + ln(1/delta)) / N) is exceeded
with probability at most delta. We check the joint of the three speculative positions (K = 512) and each
position's marginal (K = 8), splitting delta = 1e-6 across the checks. The same check must FAIL on
deliberately broken acceptance rules (the mutations below), proving it can catch a wrong sampler.

Sample sizes: 10,000 generations per distribution checked. The subtlest rule broken below (the residual
taken from p instead of max(0, p - q)) then exceeds its bound 2.0-2.4x (host path, several rounds, in a
batch: measured, 2026-12-03); accepting every draft or inverting the ratio exceeds it 2.7-6x, and 4,000
generations suffice to show those (3.2x at 3,000). Each generation is a few ONNX Runtime runs on tiny
models: these checks are most of the default suite's time.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import pytest

import specrt
from specrt import GenerationOptions
from specrt.decoding import speculative
from specrt.decoding.sampling import warp

VOCAB = 8
PROMPT = [3, 5, 4, 6, 7]
NEW = 4  # the first token comes from prefill; a k = 2 round then yields the next three
DELTA = 1e-6


@pytest.fixture(scope="module")
def engine(zoo):
    """Decisions in the bundle's sampler graphs (the default path)."""
    zoo.checkpoint("small-vocab-target", "llama", vocab_size=VOCAB, layers=2, seed=11, init_range=0.3)
    zoo.checkpoint("small-vocab-draft", noise_from="small-vocab-target", vocab_size=VOCAB, noise=0.1, seed=12)
    target = zoo.bundle("small-vocab-target", "small-vocab-target")
    draft = zoo.bundle("small-vocab-draft", "small-vocab-draft", role="draft")
    e = specrt.load(target, draft)
    assert e.stats["sampler"] == "graph"
    return e


@pytest.fixture(scope="module")
def host_engine(engine):
    """The same pair with decisions in numpy on logits read back (the reference path)."""
    return specrt.load(engine.target.bundle.path, engine.draft.bundle.path, sampler="host")


@pytest.fixture(scope="module")
def engines(engine, host_engine):
    return {"graph": engine, "host": host_engine}


_EXACT: dict = {}  # (target, N, warp) -> the exact distribution: it depends on nothing else


def exact_distribution(engine, options) -> np.ndarray:
    """P(t1..tN | PROMPT) under the warped target, N = options.max_new_tokens, by walking the tree of prefixes
    (one target forward per prefix with any mass): shape [V] * N."""
    key = (str(engine.target.bundle.path), options.max_new_tokens, options.temperature, options.top_k, options.top_p)
    if key not in _EXACT:
        _EXACT[key] = _exact(engine, options)
    return _EXACT[key]


def _exact(engine, options) -> np.ndarray:
    session, new = engine.target, options.max_new_tokens
    row = session.kv.rows[0]
    probs = np.zeros((VOCAB,) * new)
    row.reset()
    session.forward(PROMPT[:-1], keep=1)
    base = row.length

    def next_token(prefix: tuple[int, ...]) -> np.ndarray:
        row.truncate(base)
        logits = session.forward([PROMPT[-1], *prefix], keep=1)
        p = warp(logits[-1:], options.temperature, options.top_k, options.top_p)[0].astype(np.float64)
        return p / p.sum()  # the sampler's float32 probabilities, renormalised in float64

    def walk(prefix: tuple[int, ...], mass: float) -> None:
        p = next_token(prefix)
        if len(prefix) == new - 1:
            probs[prefix] = mass * p
            return
        for token in np.flatnonzero(p):
            walk((*prefix, int(token)), mass * p[token])

    walk((), 1.0)
    row.reset()
    return probs


def sample_counts(engine, options, n: int) -> np.ndarray:
    counts = np.zeros((VOCAB,) * options.max_new_tokens)
    for seed in range(n):
        gen = engine.complete(PROMPT, GenerationOptions(**{**options.__dict__, "seed": seed}))
        counts[tuple(gen.token_ids)] += 1
    return counts


def distance_report(exact: np.ndarray, counts: np.ndarray) -> list[tuple[str, float, float]]:
    """(statistic, L1 distance, bound) for the joint of positions 2..4 and each later position's marginal;
    past four tokens also the joint of every two neighbouring positions."""
    n, new = counts.sum(), exact.ndim
    checks = [("joint t2..t4", (1, 2, 3))] + [(f"marginal t{i + 1}", (i,)) for i in range(1, new)]
    checks += [(f"joint t{i}..t{i + 1}", (i - 1, i)) for i in range(4, new)]
    delta = DELTA / len(checks)
    out = []
    for name, axes in checks:
        drop = tuple(a for a in range(new) if a not in axes)
        p, q = exact.sum(axis=drop).ravel(), counts.sum(axis=drop).ravel() / n
        bound = math.sqrt(2 * (p.size * math.log(2) + math.log(1 / delta)) / n)
        out.append((name, float(np.abs(p - q).sum()), bound))
    return out


def failed(report) -> list[str]:
    return [f"{name}: L1 {d:.4f} > bound {b:.4f}" for name, d, b in report if d > b]


SETTINGS = {
    "plain": dict(temperature=1.0),
    "warped": dict(temperature=0.7, top_k=6, top_p=0.9),
}


@pytest.mark.parametrize("setting,path", [("plain", "graph"), ("warped", "graph"), ("warped", "host")], ids=lambda x: x)
def test_speculative_sampling_matches_target(engines, setting, path):
    """The graph path (the default) in both settings; the numpy reference path with top-k and top-p."""
    engine = engines[path]
    options = GenerationOptions(max_new_tokens=NEW, num_draft_tokens=2, ignore_eos=True, **SETTINGS[setting])
    exact = exact_distribution(engine, options)
    assert math.isclose(exact.sum(), 1.0, rel_tol=1e-9)
    counts = sample_counts(engine, options, 10_000)
    report = distance_report(exact, counts)
    assert not failed(report), report
    # The draft really disagrees with the target, so rejections and residual resampling were exercised.
    gen = engine.complete(
        PROMPT,
        GenerationOptions(max_new_tokens=200, num_draft_tokens=2, ignore_eos=True, seed=0, **SETTINGS[setting]),
    )
    assert 0.2 < gen.stats.acceptance_rate < 0.95, gen.stats.acceptance_rate


def _accept_always(p_x, q_x, u):
    return True


def _inverted_ratio(p_x, q_x, u):
    return u * p_x < q_x


def _resample_from_target(p_target, p_draft):
    return np.asarray(p_target, np.float32)


# numpy's rules, broken by replacing a function of decoding.speculative (the host path)
MUTATIONS = {
    "accept every draft": ("accepted", _accept_always),
    "acceptance ratio inverted (q/p)": ("accepted", _inverted_ratio),
    "resample from p instead of the residual (p-q)+": ("residual", _resample_from_target),
}
SUBTLE = {"resample from p instead of the residual (p-q)+"}  # the others are caught with 4,000 samples
# the graph's rules, broken by building verify_sampled with a wrong rule (the graph path); its residual taken
# from p is caught over several rounds and in a batch below
GRAPH_MUTATIONS = {"accept every draft": "accept_all"}


@contextmanager
def broken_graph(engine, rule: str):
    """The engine's sampled verification swapped for one built with a deliberately wrong rule."""
    from specrt.export.sampler import verify_sampled

    sampler = engine.decider.sampler
    old = sampler.swap("verify_sampled", verify_sampled(rule).SerializeToString())
    try:
        yield
    finally:
        sampler.swap("verify_sampled", old)


@pytest.mark.parametrize(
    "path,mutation", [("host", m) for m in sorted(MUTATIONS)] + [("graph", m) for m in sorted(GRAPH_MUTATIONS)]
)
def test_broken_acceptance_rule_is_caught(engines, monkeypatch, path, mutation):
    engine = engines[path]
    options = GenerationOptions(max_new_tokens=NEW, num_draft_tokens=2, ignore_eos=True, temperature=1.0)
    exact = exact_distribution(engine, options)
    n = 10_000 if mutation in SUBTLE else 4_000
    if path == "host":
        monkeypatch.setattr(speculative, *MUTATIONS[mutation])
        report = distance_report(exact, sample_counts(engine, options, n))
    else:
        with broken_graph(engine, GRAPH_MUTATIONS[mutation]):
            report = distance_report(exact, sample_counts(engine, options, n))
    assert failed(report), f"the distribution check did not notice '{mutation}' ({path}): {report}"


@pytest.fixture(scope="module")
def lookup_engines(zoo, engine):
    from specrt.tuning.acceptance import AcceptanceEstimate, ConfidenceCalibration
    from specrt.tuning.costmodel import Policy, Tuning
    from specrt.tuning.profile import CostProfile
    from specrt.tuning.stepcost import StepCosts

    target, draft = engine.target.bundle.path, engine.draft.bundle.path
    # The toy draft costs as much as the toy target, so measured costs would (rightly) turn speculation
    # off; pretend drafting is cheap (costs frozen: learn=False, no plain-step timing) so that auto k really
    # varies k from round to round. The engine's tuning is its public seam for that.
    flat = CostProfile({}, "", [1], [1, 2, 3], [[10.0, 10.5, 11.0]])
    cheap = CostProfile({}, "", [1], [1, 2], [[1.0, 1.0]])
    no_timing = Policy(plain_every=None)
    auto = specrt.load(target, draft)
    auto.tuning = Tuning(steps=StepCosts(flat, cheap, learn=False), policy=no_timing)
    # Here a third verify position costs more (t(3) = 12.5) and beliefs are pinned (acceptance 0.7 per
    # position, calibration = the draft's confidence): k = 2 is chosen every round, and after a first draft
    # the draft is less than 0.6 sure of, the round stops at one.
    stops = specrt.load(target, draft)
    steep = CostProfile({}, "", [1], [1, 2, 3], [[10.0, 10.5, 12.5]])
    stops.tuning = Tuning(
        steps=StepCosts(steep, cheap, learn=False),
        calibration=ConfidenceCalibration(prior_weight=1e9),
        priors={"model": AcceptanceEstimate(prior=0.7, prior_weight=1e9)},
        policy=no_timing,
    )
    both = specrt.load(target, draft, ngram=True)
    both.tuning = Tuning(steps=StepCosts(flat, cheap, learn=False), policy=no_timing)
    return {
        "auto k": auto,
        "auto k, early stops": stops,
        "ngram": specrt.load(target, ngram=True),
        "ngram+model": specrt.load(target, draft, ngram=True),
        "ngram+model auto k": both,
    }


@pytest.mark.parametrize("variant", ["auto k", "auto k, early stops", "ngram", "ngram+model", "ngram+model auto k"])
def test_other_drafting_modes_match_target(engine, lookup_engines, variant, monkeypatch):
    """Auto k (the cost model varies k per round), auto k where the draft's confidence ends rounds early,
    n-gram proposals (one-hot q), and both combined (fixed k: n-gram first; auto k: the drafter promising
    more tokens per ms)."""
    k = None if "auto k" in variant else 2
    e = lookup_engines[variant]
    stopped: list[bool] = []  # per keep_drafting verdict: did the round end there?
    if variant == "auto k, early stops":  # every request's cost model is a copy: watch the method itself
        from specrt.tuning.costmodel import CostModel

        decide = CostModel.keep_drafting
        monkeypatch.setattr(CostModel, "keep_drafting", lambda *a: stopped.append(not decide(*a)) or not stopped[-1])
    options = GenerationOptions(
        max_new_tokens=NEW, num_draft_tokens=k, max_draft_tokens=2, ignore_eos=True, temperature=1.0
    )
    report = distance_report(exact_distribution(e, options), sample_counts(e, options, 10_000))
    assert not failed(report), report
    gen = e.complete(
        PROMPT * 3, GenerationOptions(max_new_tokens=300, num_draft_tokens=k, ignore_eos=True, temperature=1.0, seed=1)
    )
    assert gen.stats.drafted > 0, gen.stats  # proposals were really made and tested
    if variant == "auto k":
        assert len([k for k in gen.stats.k_histogram if k > 0]) >= 2  # k really varied
    if variant == "auto k, early stops":  # rounds were cut short by the draft's confidence, and not all
        assert 0.1 < sum(stopped) / len(stopped) < 0.9, (sum(stopped), len(stopped))


def test_target_only_sampling_matches_target(engine):
    """The k = 0 path (plain sampling) is held to the same check."""
    options = GenerationOptions(max_new_tokens=NEW, num_draft_tokens=0, ignore_eos=True, temperature=1.0)
    report = distance_report(exact_distribution(engine, options), sample_counts(engine, options, 10_000))
    assert not failed(report), report


SEVERAL = 6  # the first token from prefill, then five over at least two rounds at k = 2 or 3


@pytest.mark.parametrize("k", [2, 3])
def test_several_rounds_match_target(engine, k):
    """Rounds after rounds: a rejection, the draft's catch-up on the target's token, the next round's drafts
    from there, and full acceptances with their bonus tokens, held to the same check over five positions."""
    options = GenerationOptions(max_new_tokens=SEVERAL, num_draft_tokens=k, ignore_eos=True, temperature=1.0)
    counts = sample_counts(engine, options, 10_000)
    report = distance_report(exact_distribution(engine, options), counts)
    assert not failed(report), report
    gens = [engine.complete(PROMPT, GenerationOptions(**{**options.__dict__, "seed": s})).stats for s in range(20)]
    assert all(g.rounds >= 2 for g in gens) and any(g.drafted > g.accepted for g in gens)  # rounds, rejections


def report_with_broken_residual(engine, new: int, k: int, sampler, n: int):
    """The distance report of n samples drawn with the residual replaced by p (a wrong sampler graph)."""
    options = GenerationOptions(max_new_tokens=new, num_draft_tokens=k, ignore_eos=True, temperature=1.0)
    exact = exact_distribution(engine, options)
    with broken_graph(engine, "residual_p"):
        return distance_report(exact, sampler(engine, options, n))


def test_broken_rule_is_caught_over_several_rounds(engine):
    report = report_with_broken_residual(engine, SEVERAL, 3, sample_counts, 8_000)
    assert failed(report), f"the check over several rounds did not notice the broken rule: {report}"


def test_seed_makes_sampling_reproducible(engine):
    options = GenerationOptions(max_new_tokens=30, num_draft_tokens=3, temperature=1.0, seed=123, ignore_eos=True)
    a = engine.complete(PROMPT, options).token_ids
    b = engine.complete(PROMPT, options).token_ids
    c = engine.complete(PROMPT, GenerationOptions(**{**options.__dict__, "seed": 124})).token_ids
    assert a == b and a != c


@pytest.fixture(scope="module")
def batch_engine(engine):
    return specrt.load(engine.target.bundle.path, engine.draft.bundle.path, max_batch=4)


def sample_counts_batched(engine, options, n: int, threads: int = 3) -> np.ndarray:
    """As sample_counts, but from `threads` threads at once beside a fourth that keeps generating with other
    settings (greedy, another temperature, auto k): every sample shares its batch with different rows."""
    import threading

    counts = np.zeros((VOCAB,) * options.max_new_tokens)
    lock, done = threading.Lock(), threading.Event()
    others = [
        GenerationOptions(max_new_tokens=6, ignore_eos=True),
        GenerationOptions(max_new_tokens=5, temperature=0.5, top_k=3, ignore_eos=True, seed=1),
        GenerationOptions(max_new_tokens=7, temperature=1.3, num_draft_tokens=1, ignore_eos=True),
    ]

    def sampler(first: int) -> None:
        for seed in range(first, n, threads):
            gen = engine.complete(PROMPT, GenerationOptions(**{**options.__dict__, "seed": seed}))
            with lock:
                counts[tuple(gen.token_ids)] += 1

    def neighbour() -> None:
        i = 0
        while not done.is_set():
            engine.complete(PROMPT[::-1], others[i % len(others)])
            i += 1

    workers = [threading.Thread(target=sampler, args=(t,)) for t in range(threads)]
    noise = threading.Thread(target=neighbour)
    for t in [*workers, noise]:
        t.start()
    for t in workers:
        t.join()
    done.set()
    noise.join()
    assert max(engine.stats["batch_sizes"]) == 4  # the samples really ran in full batches
    return counts


def test_batched_speculative_sampling_matches_target(batch_engine):
    options = GenerationOptions(max_new_tokens=NEW, num_draft_tokens=2, ignore_eos=True, temperature=1.0)
    report = distance_report(
        exact_distribution(batch_engine, options), sample_counts_batched(batch_engine, options, 10_000)
    )
    assert not failed(report), report


def test_broken_acceptance_rule_is_caught_in_a_batch(batch_engine):
    report = report_with_broken_residual(batch_engine, NEW, 2, sample_counts_batched, 10_000)
    assert failed(report), f"the distribution check did not notice the broken rule in a batch: {report}"
