"""CUDA graphs' bookkeeping on the CPU (runtime/cudagraphs.py): the shape each run is padded to, the graph id it
passes, the fixed buffers it reads and writes, the cap. The CPU provider ignores the ids and runs the padded
runs as they are, so the padding is checked for what it computes too: the same tokens as unpadded runs."""

from __future__ import annotations

import pytest
from test_sampler_graphs import _together

import specrt
from specrt import GenerationOptions
from specrt.bundle.loading import open_bundle
from specrt.engine.api import Engine
from specrt.errors import OptionsError
from specrt.runtime.cudagraphs import Shape, plan
from specrt.runtime.session import ModelSession, SessionOptions

PROMPTS = ["def f(x):", "import os\n", "class A:", "for i in range(3):"]


def test_the_shape_a_run_is_padded_to():
    lengths = [10, 0, 30, 0, 0, 0, 0, 0]
    # A decode step over slots 0 and 2: rows to the bucket 4, T = 31 to 64.
    assert plan(3, 1, lengths, [1, 0, 1], 9, 256, 2) == Shape(4, 1, 64, 2)
    # A verify pass of 3 + 1 tokens: width to 9; T = 70 to 128.
    assert plan(1, 4, [66, *lengths[1:]], [4], 9, 256, 1) == Shape(1, 9, 128, 1)
    assert plan(5, 1, lengths, [1] * 5, 9, 256, 0).rows == 8
    assert plan(3, 1, lengths[:3], [1, 1, 1], 9, 256, 0).rows == 3  # no more rows than the session has
    assert plan(1, 12, lengths, [12], 9, 256, 0) is None  # a prefill chunk
    assert plan(1, 2, [250, *lengths[1:]], [2], 9, 256, 0) is None  # padding would write past the slot
    assert plan(1, 1, [200, *lengths[1:]], [1], 9, 256, 0).attend == 256  # T capped at the buffer


@pytest.fixture(scope="module")
def engines(zoo):
    target, draft = zoo.target(), zoo.noisy_draft()
    graphs = SessionOptions(cuda_graphs=True)
    return {
        "plain": specrt.load(target, draft, max_batch=4),
        "graphs": Engine(target, draft, graphs, graphs, max_batch=4),
    }


def _ids(session, monkeypatch) -> list[str]:
    """The gpu_graph_id every run of `session` passes from now on."""
    seen = []
    real = session.session

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def run_with_iobinding(self, io, run_options=None):
            seen.append(None if run_options is None else run_options.get_run_config_entry("gpu_graph_id"))
            return real.run_with_iobinding(io, run_options)

    monkeypatch.setattr(session, "session", Recording())
    return seen


def test_padded_runs_give_the_same_tokens_and_pass_their_graph_ids(engines, monkeypatch):
    plain, graphs = engines["plain"], engines["graphs"]
    target = graphs.target
    ids = _ids(target, monkeypatch)
    logits_at = target.graphs.logits.ptr
    for temperature in (0.0, 0.8):
        options = [
            GenerationOptions(max_new_tokens=24, num_draft_tokens=k, temperature=temperature, seed=i, ignore_eos=True)
            for i, k in enumerate([3, 2, 0, 3])
        ]
        alone = [plain.complete(p, o).token_ids for p, o in zip(PROMPTS, options, strict=True)]
        assert [graphs.complete(p, o).token_ids for p, o in zip(PROMPTS, options, strict=True)] == alone
        assert [g.token_ids for g in _together(graphs, PROMPTS, options)] == alone
    captured = target.graphs.shapes
    assert {s.width for s in captured} == {1, 9} and {s.rows for s in captured} >= {1, 4}
    assert sorted(c.graph_id for c in captured.values()) == list(range(1, len(captured) + 1))
    assert sum(c.runs for c in captured.values()) == sum(i not in ("-1", None) for i in ids) > 0
    assert None not in ids and "0" not in ids  # every other run says -1: id 0 would capture it
    assert set(ids) == {"-1", *(str(c.graph_id) for c in captured.values())}
    assert target.graphs.logits.ptr == logits_at  # where the captured graphs write
    draft = graphs.draft.graphs
    assert draft.shapes and sum(c.runs for c in draft.shapes.values()) > 0


@pytest.mark.parametrize("k", [0, 3])
def test_sampled_requests_stay_equal_one_after_another(zoo, engines, k):
    """Request after request in the same slots: a sampler graph reads the logits of a prefill (the session's
    buffer) and of padded decode steps (the graphs' buffer) through one IO binding, so a binding remembered by
    the wrong buffer would sample from stale logits (it did, from the fourth request on). A fresh engine: which
    buffer bound last depends on every run before."""
    graphs = SessionOptions(cuda_graphs=True)
    plain, graphs = engines["plain"], Engine(zoo.target(), zoo.noisy_draft(), graphs, graphs, max_batch=4)
    for rep in range(3):
        for i, prompt in enumerate(PROMPTS):
            o = GenerationOptions(max_new_tokens=16, num_draft_tokens=k, temperature=0.8, seed=i, ignore_eos=True)
            assert graphs.complete(prompt, o).token_ids == plain.complete(prompt, o).token_ids, (rep, i)


def test_each_shape_keeps_its_buffers(engines):
    """A captured graph replays with the addresses it was captured with: every run of a shape writes its
    inputs into the same buffer, bound once."""
    graphs = engines["graphs"]
    shapes = graphs.target.graphs.shapes
    before = {shape: (c.inputs.ptr, c.io) for shape, c in shapes.items()}
    graphs.complete(PROMPTS[0], GenerationOptions(max_new_tokens=12, num_draft_tokens=3))
    assert all((c.inputs.ptr, c.io) == before[shape] for shape, c in shapes.items() if shape in before)


def test_past_the_cap_runs_as_usual(zoo):
    """Two shapes captured, the third runs as usual; each run's logits as an unpadded session's."""
    session = ModelSession(open_bundle(zoo.target()), SessionOptions(cuda_graphs=True), rows=4)
    reference = ModelSession(open_bundle(zoo.target()), rows=4)
    session.graphs.cap = 2
    for slots, width in (([0], 1), ([0], 4), ([0, 1], 1), ([0], 1)):
        ids = [[5 + i] * width for i in range(len(slots))]
        got = session.run(slots, ids, [width] * len(slots))
        want = reference.run(slots, ids, [width] * len(slots))
        assert all(abs(a - b).max() < 1e-5 for a, b in zip(got, want, strict=True))
    assert [s.rows for s in session.graphs.shapes] == [1, 1] and session.graphs.uncaptured["cap"] == 1
    assert [c.runs for c in session.graphs.shapes.values()] == [2, 1]


def test_cuda_graphs_are_refused_where_they_cannot_run(zoo):
    with pytest.raises(OptionsError, match="CUDA graphs need device cuda"):
        specrt.load(zoo.target(), cuda_graphs=True)
    gqa = zoo.bundle("target-trt-gqa", "target", graph="gqa")
    with pytest.raises(OptionsError, match="CUDA graphs need a bundle of the standard graph"):
        ModelSession(open_bundle(gqa), SessionOptions(cuda_graphs=True))


def test_the_cuda_provider_is_asked_to_capture():
    from specrt.runtime import providers as P

    assert P.provider_list("cuda", 0, cuda_graph=True)[0][1]["enable_cuda_graph"] == "1"
    assert "enable_cuda_graph" not in P.provider_list("cuda", 0)[0][1]
