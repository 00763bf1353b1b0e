"""The sampler graphs against the numpy reference: given the same logits and uniforms, the same tokens.

Randomised cases over every setting (greedy, temperature, top-k, top-p, both), ragged rows with different
k and modes in one run, model drafts and prompt lookup. The graphs run through the runtime's own
GraphSampler (device buffers, IO binding, the top-p widening) on logits placed in a device buffer as a
model run leaves them; numpy runs decoding.speculative. Float32 on both sides: the only admissible
difference is a uniform landing within a rounding error of a CDF step, which these seeds never do (a
mismatch fails with the case that caused it).
"""

from __future__ import annotations

import numpy as np
import pytest

from specrt import GenerationOptions
from specrt.decoding.speculative import accept_drafts, pick
from specrt.engine.decide import settings
from specrt.runtime.buffers import DeviceBuffer, Logits, Transfers
from specrt.runtime.sampler import GraphSampler
from specrt.runtime.session import SessionOptions

SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=0.6),
    dict(temperature=1.3, top_k=5),
    dict(temperature=0.9, top_p=0.7),
    dict(temperature=0.8, top_k=40, top_p=0.9),
    dict(temperature=1.0, top_p=0.999),  # widens the top-p candidate set on a flat distribution
]


class Row:
    """What the deciders read of a request: options, slot."""

    def __init__(self, options: GenerationOptions, slot: int):
        self.options, self.slot = options, slot


@pytest.fixture(scope="module")
def sampler(zoo):
    from specrt.bundle.loading import open_bundle

    transfers = Transfers()
    return GraphSampler(open_bundle(zoo.target()), SessionOptions(intra_op_threads=1), slots=8, transfers=transfers)


def on_device(array: np.ndarray, starts: list[int], keep: list[int]) -> Logits:
    buf = DeviceBuffer("cpu", 0, Transfers())
    buf.reserve(array.size)
    buf._host[: array.size] = array.ravel()
    return Logits(buf, array.shape[0], array.shape[1], starts, keep)


def random_logits(rng, rows: int, vocab: int, peaked: bool) -> np.ndarray:
    scale = 4.0 if peaked else 0.3  # peaked: top-p inside 256 candidates; flat: it needs more
    return (rng.normal(0, scale, size=(rows, vocab))).astype(np.float32)


@pytest.mark.parametrize("vocab", [64, 257, 3000])
@pytest.mark.parametrize("seed", range(4))
def test_pick_matches_numpy(sampler, vocab, seed):
    rng = np.random.default_rng(seed)
    rows = [Row(GenerationOptions(**SETTINGS[i % len(SETTINGS)]), slot=i) for i in range(8)]
    logits = random_logits(rng, len(rows), vocab, peaked=seed % 2 == 0)
    u = rng.random(len(rows), dtype=np.float32)
    sampler.ensure_steps(3, vocab)
    reruns = sampler.reruns
    tokens, confidences = sampler.pick(on_device(logits, list(range(8)), [1] * 8), settings(rows), u, list(range(8)), 2)
    for i, r in enumerate(rows):
        token, q, confidence = pick(logits[i], r.options, None if r.options.greedy else float(u[i]))
        assert tokens[i] == token, (i, r.options)
        assert confidences[i] == pytest.approx(confidence, rel=1e-5)
        if q is not None:  # the row's q went to q_store[slot, step]
            stored = sampler.q_store._host[: 8 * sampler.steps * vocab].reshape(8, sampler.steps, vocab)[r.slot, 2]
            np.testing.assert_allclose(stored, q, atol=1e-6)
    if vocab > 256 and seed % 2:  # flat logits: top-p 0.999 needed more than the first 256 candidates
        assert sampler.reruns > reruns


@pytest.mark.parametrize("seed", range(6))
def test_verify_matches_numpy(sampler, seed):
    """Ragged rows (k 0-4), mixed greedy / sampled settings, model drafts and prompt lookup in one run; drafts
    drawn from q (so that some are accepted and some rejected) or copied from the target's argmax."""
    rng = np.random.default_rng(100 + seed)
    vocab, n = 500, 8
    rows = [Row(GenerationOptions(**SETTINGS[(i + seed) % len(SETTINGS)]), slot=i) for i in range(n)]
    ks = [int(rng.integers(0, 5)) for _ in rows]
    lookup = [bool(rng.random() < 0.3) for _ in rows]
    sampler.ensure_steps(5, vocab)
    draft_logits = random_logits(rng, n * 4, vocab, peaked=True).reshape(n, 4, vocab)
    target_logits = [
        draft_logits[i, : ks[i] + 1 if ks[i] < 4 else 4] + rng.normal(0, 1.0, size=(1, vocab)).astype(np.float32)
        for i in range(n)
    ]
    target_logits = [np.concatenate([t, t[-1:] + 0.5])[: ks[i] + 1] for i, t in enumerate(target_logits)]
    drafted, q = [[] for _ in rows], [[] for _ in rows]
    for step in range(4):  # the draft's picks: q into q_store, the same q kept for numpy
        u = rng.random(n, dtype=np.float32)
        tokens, _ = sampler.pick(
            on_device(draft_logits[:, step], list(range(n)), [1] * n), settings(rows), u, list(range(n)), step
        )
        for i, r in enumerate(rows):
            token, qi, _ = pick(draft_logits[i, step], r.options, None if r.options.greedy else float(u[i]))
            assert token == tokens[i]
            if step < ks[i]:
                if lookup[i] or rng.random() < 0.3:  # a proposal the target likes: its argmax
                    token = int(target_logits[i][step].argmax())
                drafted[i].append(token)
                q[i].append(None if lookup[i] else qi)
    flat = np.concatenate(target_logits)
    starts = np.concatenate([[0], np.cumsum([k + 1 for k in ks])[:-1]]).tolist()
    u_accept = rng.random((n, 5), dtype=np.float32)
    u_final = rng.random(n, dtype=np.float32)
    logits = on_device(flat, starts, [k + 1 for k in ks])
    n_graph, next_graph = sampler.verify(logits, drafted, settings(rows), lookup, list(range(n)), u_accept, u_final)
    outcomes = set()
    for i, r in enumerate(rows):
        u = None if r.options.greedy else np.concatenate([u_accept[i, : ks[i]], u_final[i : i + 1]])
        expected = accept_drafts(target_logits[i], drafted[i], q[i], r.options, u)
        assert (int(n_graph[i]), int(next_graph[i])) == expected, (i, r.options, ks[i], lookup[i])
        outcomes.add("full" if expected[0] == ks[i] else "rejected")
    assert outcomes == {"full", "rejected"} or seed % 2  # the cases really exercise both branches


def test_only_ids_cross(sampler):
    """A verification of 8 rows x 5 positions over a 151,936-token vocabulary reads back 16 bytes per row."""
    vocab, n, k = 151_936, 8, 4
    rows = [Row(GenerationOptions(temperature=0.8, top_k=50), slot=i) for i in range(n)]
    rng = np.random.default_rng(0)
    logits = on_device(random_logits(rng, n * (k + 1), vocab, True), [i * (k + 1) for i in range(n)], [k + 1] * n)
    sampler.ensure_steps(k, vocab)
    before = sampler.transfers.to_host
    sampler.verify(
        logits,
        [[1, 2, 3, 4]] * n,
        settings(rows),
        [False] * n,
        list(range(n)),
        rng.random((n, k), dtype=np.float32),
        rng.random(n, dtype=np.float32),
    )
    read = sampler.transfers.to_host - before
    assert read <= n * 16 + n * (k + 1), read  # accepted + next (int64 each) and a short flag per position


@pytest.fixture(scope="module")
def pair(zoo):
    import specrt

    target, draft = zoo.target(), zoo.noisy_draft()
    return {
        "graph": specrt.load(target, draft, max_batch=4),
        "host": specrt.load(target, draft, max_batch=4, sampler="host"),
    }


def _together(engine, prompts, options) -> list:
    import threading

    out = [None] * len(prompts)

    def run(i):
        out[i] = engine.complete(prompts[i], options[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _in_slot_order(engine, prompts, options) -> list:
    """As `_together`, but request i admitted to slot i: the requests reach an idle engine's inbox together
    and its scheduler takes them all at once, in order, into the lowest free slots (an admission that waited
    on timing let a short request finish and free its slot before the last one came)."""
    import threading
    import time

    engine.reset()  # waits for an idle scheduler thread to end
    deadline = time.monotonic() + 30
    out = [engine.generate(p, o) for p, o in zip(prompts, options, strict=True)]
    held = []
    threads = []
    for g in out:
        g._submit = held.append  # each reader hands its request over here instead of to the engine
        threads.append(threading.Thread(target=g.consume))
        threads[-1].start()
        while len(held) < len(threads) and time.monotonic() < deadline:
            time.sleep(0.0005)
    assert [r is g._request for r, g in zip(held, out, strict=True)] == [True] * len(out)
    with engine._lock:  # no scheduler thread runs (checked above): nothing drains the inbox meanwhile
        assert engine._thread is None
        for r in held[:-1]:
            engine._inbox.put(r)
    engine._submit(held[-1])  # starts the scheduler, which takes all of them in one drain
    for t in threads:
        t.join()
    assert [g._request.slot for g in out] == list(range(len(out)))  # a slot is kept after release
    return out


def test_the_engine_reads_back_ids_only(pair):
    """Batch 4, k = 3, greedy and sampled rows together: on the graph path the host reads a few bytes per
    row and token; on the numpy path every logits row (the counter sees the difference)."""
    prompts = ["def f(x):", "import os\n", "class A:", "for i in range(3):"]
    options = [
        GenerationOptions(max_new_tokens=30, num_draft_tokens=3, ignore_eos=True, **SETTINGS[i % 3]) for i in range(4)
    ]
    per_token = {}
    for path, engine in pair.items():
        before = engine.stats
        gens = _together(engine, prompts, options)
        assert max(engine.stats["batch_sizes"]) >= 2 and sum(g.stats.drafted for g in gens) > 0
        per_token[path] = (engine.stats["bytes_to_host"] - before["bytes_to_host"]) / sum(
            g.stats.new_tokens for g in gens
        )
    vocab = pair["graph"].target.vocab_size
    assert per_token["graph"] <= 64, per_token  # ids, counts, confidences: tens of bytes per token
    assert per_token["host"] >= 4 * vocab, per_token  # at least one float32 logits row per token


def test_a_seeded_request_is_the_same_alone_in_a_batch_and_on_either_path(pair):
    options = GenerationOptions(
        max_new_tokens=40, num_draft_tokens=3, temperature=0.8, top_k=20, seed=7, ignore_eos=True
    )
    prompt = "def merge(a, b):"
    alone = {path: e.complete(prompt, options).token_ids for path, e in pair.items()}
    others = [GenerationOptions(max_new_tokens=50, temperature=1.2, seed=i, ignore_eos=True) for i in range(3)]
    batched = _together(pair["graph"], [prompt, "x = 1", "import re", "a"], [options, *others])[0].token_ids
    assert alone["graph"] == alone["host"] == batched


def test_sampled_draft_steps_chain_on_the_device(pair, monkeypatch):
    """Rows that sample (temperature, top-k; a greedy one among them) at a fixed k chain their draft steps:
    each model step is followed by its pick graph's run, which writes the token the next model step reads.
    The tokens are the numpy path's, alone and in a full batch; a row with top-p does not chain (a short
    candidate set needs the host between two steps)."""
    from specrt.runtime.chain import Chain

    graph, host = pair["graph"], pair["host"]
    started = []
    start = Chain.start

    def recorded(c, *a):
        start(c, *a)
        started.append((c.hi - c.lo, a[2] is not None, c.drafting))

    monkeypatch.setattr(Chain, "start", recorded)
    prompts = ["def f(x):", "import os\n", "class A:", "for i in range(3):"]
    options = [
        GenerationOptions(max_new_tokens=30, num_draft_tokens=3, ignore_eos=True, seed=i, **SETTINGS[j])
        for i, j in enumerate([1, 3, 0, 2])
    ]
    alone = [graph.complete(p, o).token_ids for p, o in zip(prompts, options, strict=True)]
    assert (1, True, 1) in started, started  # sampled steps chained at batch 1
    assert alone == [host.complete(p, o).token_ids for p, o in zip(prompts, options, strict=True)]
    started.clear()
    assert [g.token_ids for g in _together(graph, prompts, options)] == alone
    assert (4, True, 4) in started, started  # ... and over the full batch
    started.clear()
    # A row that ends early leaves its slot between two rows still drafting: the chain runs it idle.
    options[1] = GenerationOptions(max_new_tokens=5, num_draft_tokens=3, ignore_eos=True, seed=1, **SETTINGS[3])
    alone[1] = host.complete(prompts[1], options[1]).token_ids
    assert [g.token_ids for g in _in_slot_order(graph, prompts, options)] == alone
    assert (4, True, 3) in started, started
    started.clear()
    top_p = GenerationOptions(max_new_tokens=20, num_draft_tokens=3, ignore_eos=True, seed=1, **SETTINGS[4])
    assert graph.complete(prompts[0], top_p).token_ids == host.complete(prompts[0], top_p).token_ids
    assert not any(sampled for _, sampled, _ in started), started


def test_device_buffers_start_zeroed(monkeypatch):
    """On a device other than the CPU, the KV buffers and the logits / q buffers are copied from zeros, never
    allocated uninitialised (the CPU provider stands in for the device here)."""
    import onnxruntime as ort

    from specrt.runtime.kvcache import KVCache

    made = []
    real = ort.OrtValue.ortvalue_from_numpy

    def from_numpy(array, device="cpu", device_id=0):
        made.append((device, bool(np.all(array == 0))))
        return real(array)  # on the CPU: this machine has no other device

    def uninitialised(*a, **k):
        raise AssertionError("a device buffer was allocated uninitialised")

    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy", staticmethod(from_numpy))
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_shape_and_type", staticmethod(uninitialised))
    KVCache(2, 2, 16, 8, device="cuda", rows=2)
    DeviceBuffer("cuda", 0, Transfers()).reserve(1000)
    assert made == [("cuda", True)] * 5


@pytest.mark.parametrize("flavour", ["standard", "gqa"])
def test_the_model_graph_computes_its_greedy_pick(zoo, flavour):
    """top_mode 1: each logits row's first argmax; 2: also its probability; 0: neither (nothing crosses)."""
    from specrt.bundle.loading import open_bundle
    from specrt.runtime.session import ModelSession

    bundle = zoo.target() if flavour == "standard" else zoo.bundle("target-gqa", "target", graph="gqa")
    rows = 4 if flavour == "standard" else 1
    session = ModelSession(open_bundle(bundle), SessionOptions(intra_op_threads=1), rows=rows)
    runs = [([0, 2, 3], [[5, 6, 7], [8, 9], [10]], [3, 2, 1]), ([0, 2], [[11], [12]], [1, 1])]
    if flavour == "gqa":
        runs = [([0], [[5, 6, 7, 8]], [3]), ([0], [[9]], [1])]
    for top in (0, 1, 2, 1):
        for slots, ids, keep in runs:
            before = session.transfers.to_host
            logits = session.run_logits(slots, ids, keep, top)
            crossed = session.transfers.to_host - before
            assert crossed == (12 * sum(keep) if top else 0)  # int64 + float32 per position when asked
            x = np.concatenate([x.astype(np.float64) for x in logits.rows()])
            if top == 0:
                assert logits.tokens is None and logits.confidences is None
                continue
            assert logits.tokens == x.argmax(-1).tolist()
            p = np.exp(x - x.max(-1, keepdims=True))
            if top == 2:
                np.testing.assert_allclose(logits.confidences, (p / p.sum(-1, keepdims=True)).max(-1), rtol=1e-5)
            else:
                assert logits.confidences is None


def _sampler_runs(engine, monkeypatch) -> list[str]:
    runs: list[str] = []
    real = type(engine.decider.sampler)._run

    def counted(self, name, *args):
        runs.append(name)
        return real(self, name, *args)

    monkeypatch.setattr(type(engine.decider.sampler), "_run", counted)
    return runs


def test_greedy_rounds_read_their_ids_from_the_model_runs(pair, monkeypatch):
    """Greedy rows, drafting at batch 1 and 3: no sampler graph runs (the draft steps and the verify pass give
    the ids), the same tokens as the numpy path; a sampled request runs them."""
    pair["graph"].decider.sampler._picks.clear()
    runs = _sampler_runs(pair["graph"], monkeypatch)
    prompts = ["def f(x):", "import os\n", "class A:"]
    greedy = GenerationOptions(max_new_tokens=24, num_draft_tokens=3, ignore_eos=True)
    alone = pair["graph"].complete(prompts[0], greedy)
    together = _together(pair["graph"], prompts, [greedy] * 3)
    assert alone.stats.drafted > 0 and sum(g.stats.drafted for g in together) > 0
    assert max(pair["graph"].stats["batch_sizes"]) >= 2
    assert runs == [], runs[:5]
    on_host = [pair["host"].complete(p, greedy).token_ids for p in prompts]
    assert [g.token_ids for g in together] == on_host and alone.token_ids == on_host[0]
    chained = pair["graph"].draft.chained_steps
    pair["graph"].complete(prompts[0], GenerationOptions(max_new_tokens=8, num_draft_tokens=3, temperature=0.8))
    assert "verify_sampled" in runs  # ... and its draft steps chained, each followed by the pick graph
    assert pair["graph"].draft.chained_steps > chained
    assert any(name == "pick_sampled" and hi - lo == 1 for name, lo, hi in pair["graph"].decider.sampler._picks)


def _as_if_exported_before(bundle, out) -> None:
    """A copy of `bundle` as exported before the model graph computed its greedy pick and before the sampler
    graphs: the top nodes, input and outputs removed, the manifest saying so."""
    import shutil
    from dataclasses import replace

    import onnx

    from specrt.bundle.integrity import record
    from specrt.bundle.loading import open_bundle

    shutil.copytree(bundle, out)
    m = open_bundle(out).manifest
    model = onnx.load(str(out / m.graph.model_file), load_external_data=False)
    top = {m.graph.top_mode, m.graph.top_token, m.graph.top_confidence}
    keep = [n for n in model.graph.node if not n.name.startswith("top/")]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    inits = [i for i in model.graph.initializer if not i.name.startswith("top/")]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    for field in (model.graph.input, model.graph.output):
        kept = [v for v in field if v.name not in top]
        del field[:]
        field.extend(kept)
    onnx.save_model(model, str(out / m.graph.model_file))
    shutil.rmtree(out / "sampler")
    g = replace(m.graph, top_mode="", top_token="", top_confidence="")
    files = [f for f in m.files if f.name != g.model_file and not f.name.startswith("sampler/")]
    replace(m, graph=g, files=[*files, record(out, g.model_file, "graph")]).write(out)


def test_an_older_bundle_runs_and_upgrades_in_place(zoo, tmp_path, monkeypatch):
    """A bundle from before: refused on the graph path with the command that fixes it, run by numpy by
    default; `specrt upgrade` adds what it lacks, after which greedy rounds read ids from the model runs
    and give the same tokens."""
    import specrt
    from specrt.cli import main
    from specrt.errors import BundleError

    old = tmp_path / "old"
    _as_if_exported_before(zoo.target(), old)
    prompt, greedy = "def f(x):", GenerationOptions(max_new_tokens=20, num_draft_tokens=3, ignore_eos=True)
    expected = specrt.load(zoo.target(), zoo.noisy_draft()).complete(prompt, greedy).token_ids
    with pytest.raises(BundleError, match="specrt upgrade"):
        specrt.load(old, zoo.noisy_draft(), sampler="graph")
    before = specrt.load(old, zoo.noisy_draft())  # sampler "auto": numpy, for want of the graphs
    assert before.decider.name == "host" and before.complete(prompt, greedy).token_ids == expected
    main(["upgrade", str(old)])
    upgraded = specrt.load(old, zoo.noisy_draft())
    assert upgraded.target.graph.top_mode
    runs = _sampler_runs(upgraded, monkeypatch)
    assert upgraded.complete(prompt, greedy).token_ids == expected and runs == []
