"""The standard graph: ai.onnx operators only, ragged rows over in-place KV slots, parity with PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_export import VARIANTS
from transformers import AutoModelForCausalLM

from specrt import open_bundle
from specrt.runtime.session import ModelSession, SessionOptions

ROWS = 3
# Steps over three slots: ("run", {slot: new tokens}) or ("rollback", {slot: n}) or ("reset", slot).
# Ragged prefills, a batched decode, a verify of 5 beside an idle slot, per-row rollbacks, a slot reused
# while the others go on, and a sequence past mistral's sliding window of 24. Two decodes of the same shape
# back to back: the second reuses the host input arrays bound for the first, its new values written in place.
PLAN = [
    ("run", {0: 7, 1: 12, 2: 3}),
    ("run", {0: 1, 1: 1, 2: 1}),
    ("run", {0: 1, 1: 1, 2: 1}),
    ("run", {0: 5, 2: 5}),
    ("rollback", {0: 3, 2: 1}),
    ("run", {0: 1, 1: 5, 2: 2}),
    ("reset", 1),
    ("run", {0: 1, 1: 9, 2: 1}),
    ("run", {0: 5, 1: 5, 2: 5}),
    ("rollback", {1: 4}),
    ("run", {0: 14, 1: 1}),
    ("run", {0: 1, 1: 1, 2: 5}),
]


def _reference(model, seq: list[int], n: int) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, -n:].numpy()


def batched_parity(bundle, checkpoint, plan=PLAN, seed=0) -> float:
    """Run `plan` through a multi-row session and each row's sequence through PyTorch; worst relative diff."""
    session = ModelSession(open_bundle(bundle), rows=ROWS)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    rng = np.random.default_rng(seed)
    seqs = {slot: [] for slot in range(ROWS)}
    worst = 0.0
    for kind, arg in plan:
        if kind == "reset":
            session.kv.rows[arg].reset()
            seqs[arg] = []
        elif kind == "rollback":
            for slot, n in arg.items():
                session.kv.rows[slot].rollback(n)
                del seqs[slot][-n:]
        else:
            slots = sorted(arg)
            new = [rng.integers(0, session.vocab_size, arg[s]).tolist() for s in slots]
            out = session.run(slots, new, [len(x) for x in new])
            for slot, x, got in zip(slots, new, out, strict=True):
                seqs[slot] += x
                ref = _reference(model, seqs[slot], len(x))
                worst = max(worst, float(np.abs(got - ref).max() / max(1.0, np.abs(ref).max())))
                assert session.kv.rows[slot].ids == seqs[slot]
                assert (got.argmax(-1) == ref.argmax(-1)).mean() == 1.0
    return worst


@pytest.fixture(scope="module")
def standard(zoo):
    def make(variant: str):
        model_type, kw = VARIANTS[variant]
        ckpt = zoo.checkpoint(f"parity-{variant}", model_type, **kw)
        return zoo.bundle(f"standard-{variant}", f"parity-{variant}", graph="standard"), ckpt

    return make


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_standard_graph_matches_pytorch_on_ragged_rows(standard, variant):
    bundle, ckpt = standard(variant)
    m = open_bundle(bundle).manifest
    assert m.graph.flavour == "standard" and m.graph.opset == 24 and m.validation.passed
    assert batched_parity(bundle, ckpt) < 1e-4


def test_standard_graph_uses_only_onnx_operators(standard):
    import onnx

    bundle, _ = standard("qwen3")  # q/k norms too
    model = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    assert {n.domain for n in model.graph.node} == {""}, "a contrib op crept in"
    assert [o.domain for o in model.opset_import] == [""] and model.opset_import[0].version == 24
    ops = {n.op_type for n in model.graph.node}
    assert {"TensorScatter", "Attention", "RotaryEmbedding", "RMSNormalization"} <= ops
    # Each KV buffer's only reader is its scatter: what lets ONNX Runtime update it in place.
    names = {i.name for i in model.graph.input if i.name.startswith("past_key_values")}
    for name in names:
        readers = [n for n in model.graph.node if name in n.input]
        assert [n.op_type for n in readers] == ["TensorScatter"], name


@pytest.mark.parametrize("variant", ["llama", "mistral"])
def test_bundles_whose_runtime_sends_the_mask_still_run(zoo, standard, variant):
    """Bundles exported before the graph built positions and masks take them from the runtime: same
    parity, through the same session (mistral: the sliding window narrows the runtime's mask)."""
    _, ckpt = standard(variant)
    bundle = zoo.bundle(f"standard-{variant}-runtime-masks", f"parity-{variant}", graph="standard", masks="runtime")
    import json

    manifest = json.loads((bundle / "manifest.json").read_text())
    del manifest["graph"]["masks"]  # as such bundles were written: the field did not exist
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    g = open_bundle(bundle).manifest.graph
    assert g.masks == "runtime" and g.attention_mask in g.inputs() and g.new_tokens not in g.inputs()
    assert batched_parity(bundle, ckpt) < 1e-4


def test_what_crosses_per_run_is_a_few_integers_per_row(standard):
    """The graph builds positions and the [B, 1, S, T] mask itself: a run sends the ids, two integers per
    row, the LM head's positions and whether to compute the greedy pick, whatever the context length."""
    import onnx

    bundle, _ = standard("mistral")
    model = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    inputs = {i.name for i in model.graph.input if not i.name.startswith("past_key_values")}
    assert inputs == {"input_ids", "write_index", "new_tokens", "logits_rows", "top_mode", "attend_length"}
    session = ModelSession(open_bundle(bundle), rows=ROWS)
    session.run([0, 1, 2], [[1] * 30, [2] * 20, [3] * 25], [1, 1, 1])  # long contexts first
    sent = session.transfers.to_device
    session.run([0, 2], [[4, 5, 6], [7]], [3, 1])  # slots 0-2 (1 idle), 3 wide, 4 logits rows
    assert session.transfers.to_device - sent == 8 * (3 * 3 + 3 + 3 + 4 + 1 + 1)


@pytest.mark.parametrize("bucket", [7, 64])
def test_the_attended_length_rounded_up_to_a_bucket_changes_nothing(standard, bucket):
    """T = max(past + new) rounded up to a multiple of the bucket (a GPU's fixed shapes), at most the
    buffer's length: the extra slots are masked like any slot past a row's length, so the logits and the
    greedy picks are those of the exact T, in batched ragged runs and up to the buffer's end."""
    bundle, _ = standard("qwen2")
    got = {}
    for b in (1, bucket):
        session = ModelSession(open_bundle(bundle), SessionOptions(attend_bucket=b), rows=ROWS)
        assert int(session.bucket[0]) == b
        first = session.run([0, 1, 2], [[1] * 9, [2, 3] * 4, [4] * 5], [1, 2, 1])
        step = session.run_logits([0, 2], [[5, 6, 7], [8]], [3, 1], top=2)
        end = session.max_len - len(session.kv.rows[1].ids) - 1
        last = session.run([1], [[9] * end], [1])  # slot 1 filled to one short of the buffer's end
        got[b] = [*first, *step.rows(), *last], step.tokens
    (exact, tokens), (rounded, tokens_rounded) = got[1], got[bucket]
    assert tokens == tokens_rounded
    for x, y in zip(exact, rounded, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_bundles_that_round_the_attended_length_themselves_still_run(standard, zoo):
    """Bundles exported before the runtime sent T computed it from the write positions and rounded it up to
    their `attend_bucket` input: read out as an extra output, then run by the runtime, whose logits are the
    new bundle's."""
    import onnx
    import onnxruntime as ort

    bundle, _ = standard("qwen2")
    legacy = zoo.bundle("standard-qwen2-bucket", "parity-qwen2", graph="standard", masks="bucket")
    g = open_bundle(legacy).manifest.graph
    assert g.attend_bucket == "attend_bucket" and not g.attend_length
    model = onnx.load(str(legacy / "model.onnx"))
    model.graph.output.append(onnx.helper.make_tensor_value_info("attended/out", onnx.TensorProto.INT64, [1]))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    limit = open_bundle(legacy).manifest.max_seq_len
    kv = {
        i.name: np.zeros([1, *[d if isinstance(d, int) else 1 for d in i.shape[1:]]], np.float32)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values")
    }

    def attended(past: int, new: int, bucket: int) -> int:
        feeds = {
            "input_ids": np.ones((1, new), np.int64),
            "write_index": np.array([past]),
            "new_tokens": np.array([new]),
        }
        feeds |= {"logits_rows": np.array([new - 1]), "top_mode": np.array([0]), "attend_bucket": np.array([bucket])}
        return int(session.run(["attended/out"], {**feeds, **kv})[0][0])

    assert [attended(10, 3, b) for b in (1, 4, 7, 64)] == [13, 16, 14, min(64, limit)]
    assert attended(limit - 2, 2, 64) == limit
    runs = []
    for path in (bundle, legacy):
        s = ModelSession(open_bundle(path), SessionOptions(attend_bucket=64), rows=ROWS)
        runs.append([*s.run([0, 2], [[1] * 9, [4] * 5], [2, 1]), *s.run([0, 1], [[5], [6, 7]], [1, 2])])
    for x, y in zip(*runs, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_the_runtime_sends_the_attended_length(standard):
    """T is an input: the longest row's end after the run, rounded up to the bucket, at most the buffer."""
    bundle, _ = standard("qwen2")
    sent = []
    session = ModelSession(open_bundle(bundle), SessionOptions(attend_bucket=16), rows=ROWS)
    real = session._execute

    def execute(io, inputs, positions, starts, keep, top, ints=None):
        assert ints[0][-1][0] == "attend_length"
        sent.append(ints[1][-1])
        return real(io, inputs, positions, starts, keep, top, ints)

    session._execute = execute
    session.run([0, 2], [[1] * 9, [4] * 5], [1, 1])  # ends 9 and 5 (slot 1 idle: 0)
    session.run([1], [[3] * 20], [1])  # ends 20
    assert sent == [16, 32]
    assert session.attend(session.max_len - 1) == session.max_len


def test_kv_update_is_in_place(zoo, tmp_path):
    """A one-token step into a large KV buffer writes into the bound buffer and costs a small fraction of
    copying that buffer once: the scatter updates it in place."""
    import time

    zoo.checkpoint("parity-qwen2", "qwen2")
    bundle = zoo.bundle("standard-long", "parity-qwen2", graph="standard", max_seq_len=131072)
    session = ModelSession(open_bundle(bundle))
    buffers = session.kv._host
    assert sum(b.nbytes for b in buffers) >= 64 << 20
    session.forward([5, 6, 7], keep=1)
    assert np.abs(buffers[0][0, :, 2]).sum() > 0 and np.abs(buffers[0][0, :, 3]).sum() == 0
    steps, copies = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        session.forward([8], keep=1)
        steps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for b in buffers:
            b.copy()
        copies.append(time.perf_counter() - t0)
    assert np.abs(buffers[0][0, :, 3]).sum() > 0  # the step's key landed in our own buffer
    print(f"one step {1000 * min(steps):.2f} ms, one copy of the buffers {1000 * min(copies):.2f} ms")
    assert min(steps) < 0.5 * min(copies), (min(steps), min(copies))  # a copying scatter: >= 1x


def test_a_gqa_bundle_refuses_several_rows(zoo):
    from specrt import OptionsError

    zoo.target()
    gqa = zoo.bundle("target-gqa", "target", graph="gqa")
    with pytest.raises(OptionsError, match="re-export it with --graph standard"):
        ModelSession(open_bundle(gqa), rows=2)


@pytest.mark.parametrize(
    "quant,weights,symmetric",
    [
        ("int8", "nbits", True),
        ("int4", "nbits", True),
        ("int4", "qdq", True),
        ("int4", "qdq", False),
        ("int8", "qdq", True),
    ],
)
def test_quantized_standard_bundles_build_and_run(zoo, standard, quant, weights, symmetric):
    import onnx

    _, ckpt = standard("qwen2")
    name = f"standard-{quant}-{weights}-{'sym' if symmetric else 'asym'}"
    bundle = zoo.bundle(name, "parity-qwen2", graph="standard", quant=quant, weights=weights, symmetric=symmetric)
    model = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    domains = {n.domain for n in model.graph.node}
    if weights == "qdq":  # nothing but ai.onnx: what TensorRT's parser reads
        assert domains == {""} and "DequantizeLinear" in {n.op_type for n in model.graph.node}
    else:
        assert domains == {"", "com.microsoft"}
    q = open_bundle(bundle).manifest.quantization
    assert (q.method, q.form, q.symmetric) == (quant, weights, symmetric)
    # Quantized logits move; the argmax mostly follows, and rows stay independent of each other.
    session = ModelSession(open_bundle(bundle), rows=2)
    ids = np.random.default_rng(1).integers(0, session.vocab_size, (2, 9)).tolist()
    together = [x.copy() for x in session.run([0, 1], [ids[0], ids[1][:4]], [9, 4])]
    for slot in (0, 1):
        session.kv.rows[slot].reset()
    alone = session.run([1], [ids[1][:4]], [4])[0]
    assert np.abs(together[1] - alone).max() < 1e-3 * max(1.0, np.abs(alone).max())


def test_chained_steps_equal_separate_runs(standard):
    """Draft steps chained on the device (the first fed 1-2 ids per row, each later one the previous step's
    greedy pick, bound in place) give the tokens, probabilities and slot contents of separate runs fed those
    tokens from the host; after the first step a chained step sends only its write positions and its T, and
    each reads back 12 B per row."""
    bundle, _ = standard("qwen2")
    feeds = [[5, 9], [6], [7, 8]]  # ragged: the ids each draft slot lacks
    runs = {}
    for how in ("separate", "chained"):
        session = ModelSession(open_bundle(bundle), rows=ROWS)
        session.run([0, 1, 2], [[1] * 9, [2, 3] * 4, [4] * 5], [1, 1, 1])  # ragged contexts
        got = []
        if how == "chained":
            chain = session.chain(0, ROWS)
            chain.start(feeds, 3)
            sent, received = session.transfers.to_device, session.transfers.to_host
            for n in (1, 3, 1):  # one step, three back to back (past the 3 bound at start), one
                tokens, confidences = chain.run(n)
                got += list(zip(tokens, confidences, strict=True))
            assert session.transfers.to_device - sent == 4 * 8 * (ROWS + 1)
            assert session.transfers.to_host - received == 5 * 12 * ROWS
            assert session.chained_steps == 5
        else:
            for _ in range(5):
                step = session.run_logits([0, 1, 2], [[t] for t in got[-1][0]] if got else feeds, [1, 1, 1], top=2)
                got.append((step.tokens, step.confidences))
        runs[how] = got, [list(r.ids) for r in session.kv.rows], [b.copy() for b in session.kv._host]
    (a, ids_a, kv_a), (b, ids_b, kv_b) = runs["separate"], runs["chained"]
    assert [t for t, _ in a] == [t for t, _ in b] and ids_a == ids_b
    np.testing.assert_allclose([c for _, c in a], [c for _, c in b], rtol=1e-5)
    for x, y in zip(kv_a, kv_b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_a_chain_runs_a_slot_that_does_not_draft_idle(standard):
    """Slots inside a chain's range that do not draft this round (a row at its last token, a slot between two
    requests) run idle, as in any batched run: the drafting rows get the tokens, probabilities and slot
    contents of separate runs over them alone, and the idle slot keeps its length and contents."""
    bundle, _ = standard("qwen2")
    feeds = [[5, 9], None, [7, 8]]
    runs = {}
    for how in ("separate", "chained"):
        session = ModelSession(open_bundle(bundle), rows=ROWS)
        session.run([0, 1, 2], [[1] * 9, [2, 3] * 4, [4] * 5], [1, 1, 1])
        got = []
        if how == "chained":
            chain = session.chain(0, ROWS)
            chain.start(feeds, 2)
            assert chain.drafting == 2
            for n in (2, 1):
                tokens, confidences = chain.run(n)
                assert all(len(t) == 2 for t in tokens)  # the drafting rows' columns only
                got += list(zip(tokens, confidences, strict=True))
        else:
            for _ in range(3):
                fed = [[t] for t in got[-1][0]] if got else [feeds[0], feeds[2]]
                step = session.run_logits([0, 2], fed, [1, 1], top=2)  # slot 1 carried idle
                got.append((step.tokens, step.confidences))
        runs[how] = got, [list(r.ids) for r in session.kv.rows], [b.copy() for b in session.kv._host]
    (a, ids_a, kv_a), (b, ids_b, kv_b) = runs["separate"], runs["chained"]
    assert [t for t, _ in a] == [t for t, _ in b] and ids_a == ids_b
    assert ids_b[1] == [2, 3] * 4  # the idle slot's length did not move
    np.testing.assert_allclose([c for _, c in a], [c for _, c in b], rtol=1e-5)
    for x, y in zip(kv_a, kv_b, strict=True):  # what the idle row wrote past its length is never read
        np.testing.assert_allclose(x[[0, 2]], y[[0, 2]], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(x[1, ..., :8, :], y[1, ..., :8, :])
