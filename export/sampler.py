"""The sampler graphs: picking a draft token and verifying drafts, in ai.onnx operators, written into every bundle.

Four small graphs, independent of the model (any vocabulary, any number of rows), run by the runtime on the
model's own device right after the model's run, fed by the device buffer its logits were written into
(specrt.runtime.sampler). What comes back to the host is token ids, accepted counts and confidences: a few
bytes per row, never a vocabulary-sized array. They implement exactly the numpy reference
(specrt.decoding.sampling / speculative) and consume the same uniforms the same way:

- warp (shared): x = (logits - max) / T; tokens below the row's k-th largest x dropped (top-k, 0: off);
  p = softmax(x); tokens below the probability of the one whose cumulative mass, most likely first, first
  reaches top_p dropped and p renormalised (1: off). Top-p reads the `candidates` most likely tokens (TopK);
  a row whose candidates hold less than top_p is flagged `short`, and the runtime runs again with more.
- sample: the token is the number of CDF values <= u * total (inverse CDF, unnormalised weights).
- pick_greedy: logits [R, V] -> token (argmax), confidence (its probability, 1 / sum exp(x - max)).
- pick_sampled: also per row temperature / top_k / top_p / greedy and a uniform; writes the row's warped q
  into q_store[slot, step] in place (ScatterND, q_store bound as input and output) for the verification.
- verify_greedy: flat target logits [N, V], each row's first position `start` and draft count `count`, the
  drafted ids [R, K] -> accepted = the longest prefix equal to the target's argmax, next = the argmax after it.
- verify_sampled: Leviathan/Chen rejection sampling per row: accept d_i while u_i * q(d_i) < p(d_i), then
  sample max(0, p - q) at the first rejection (p itself where that is all zero; after a full acceptance q is
  zero there, so the bonus token is drawn from p); prompt lookup rows (`lookup`) have one-hot q; greedy rows
  of the same run take the greedy rule.
`rule` builds deliberately broken verifiers ("accept_all", "residual_p") for the tests that prove the
distribution suite catches a wrong sampler.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OPSET = 21
GRAPHS = ("pick_greedy", "pick_sampled", "pick_filtered", "verify_greedy", "verify_sampled", "verify_filtered")
FOLDER = "sampler"
RULES = ("exact", "accept_all", "residual_p")


class _Graph:
    """Nodes and constants of one small graph, with generated names."""

    def __init__(self, name: str, prefix: str = ""):
        self.name, self.nodes, self.inits, self.inputs, self.outputs, self._n = name, [], [], [], [], 0
        self.prefix = prefix  # on every generated name: nodes added to a model graph must not clash with its own

    def input(self, name: str, elem: int, shape: list) -> str:
        from onnx import helper

        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, value: str, name: str, elem: int, shape: list) -> None:
        from onnx import helper

        self.op("Identity", value, out=name)
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    def const(self, value, dtype=np.int64) -> str:
        from onnx import numpy_helper

        self._n += 1
        name = f"{self.prefix}c{self._n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None, n_out: int = 1, **attrs):
        from onnx import helper

        self._n += 1
        outputs = [out] if out else [f"{self.prefix}{op_type.lower()}{self._n}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=f"{self.prefix}n{self._n}", **attrs))
        return outputs[0] if n_out == 1 else outputs

    def model(self):
        from onnx import helper

        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="specrt")
        model.ir_version = 10
        return model

    # ------------------------------------------------------------------ small helpers

    def col(self, x: str) -> str:  # [R] -> [R, 1]
        return self.op("Unsqueeze", x, self.const([1]))

    def flat(self, x: str) -> str:
        return self.op("Reshape", x, self.const([-1]))

    def count(self, mask: str, axis: int = 1, keepdims: int = 0) -> str:
        """Number of True along `axis` (int64)."""
        return self.op("ReduceSum", self.op("Cast", mask, to=7), self.const([axis]), keepdims=keepdims)

    def leading(self, mask: str) -> str:
        """[R, K] bool -> [R]: how many leading entries of each row are True."""
        misses = self.op("CumSum", self.op("Cast", self.op("Not", mask), to=7), self.const(1))
        return self.count(self.op("Equal", misses, self.const(0)))

    def vocab(self, logits: str) -> str:
        """V as a [1] int64."""
        return self.op("Slice", self.op("Shape", logits), self.const([1]), self.const([2]))

    def last(self, x: str) -> str:
        """x[:, -1:] of a [R, M] tensor."""
        return self.op("Slice", x, self.const([-1]), self.const([np.iinfo(np.int64).max]), self.const([1]))


def _warp(g: _Graph, logits: str, temperature: str, filters) -> tuple[str, str | None]:
    """p [N, V] from logits and per-row temperature; with filters (top_k, top_p, candidates) also top-k and
    top-p, and short [N] (top-p not reached within the candidates)."""
    from onnx import TensorProto as T

    if filters is None:  # temperature only: one Div and a Softmax over [N, V]
        return g.op("Softmax", g.op("Div", logits, g.col(temperature)), axis=-1), None
    top_k, top_p, candidates = filters
    vocab = g.vocab(logits)
    top = g.op("ReduceMax", logits, g.const([1]), keepdims=1)
    x = g.op("Div", g.op("Sub", logits, top), g.col(temperature))
    # top-k: one TopK at the largest k of the run, each row's own k-th value read from it.
    kmax = g.op("Min", g.op("Max", g.op("ReduceMax", top_k, keepdims=1), g.const([1])), vocab)
    kvals = g.op("TopK", x, kmax, axis=-1, n_out=2)[0]
    at_k = g.op("Sub", g.op("Min", g.op("Max", top_k, g.const(1)), kmax), g.const(1))  # in range for any k
    kth = g.op("GatherElements", kvals, g.col(at_k), axis=1)
    use_k = g.col(g.op("And", g.op("Greater", top_k, g.const(0)), g.op("Less", top_k, g.op("Squeeze", vocab))))
    ninf = g.const(-np.inf, np.float32)
    x = g.op("Where", g.op("And", use_k, g.op("Less", x, kth)), ninf, x)
    p = g.op("Softmax", x, axis=-1)
    # top-p over the `candidates` most likely tokens, sorted.
    m = g.op("Min", candidates, vocab)
    pvals = g.op("TopK", p, m, axis=-1, n_out=2)[0]
    cum = g.op("CumSum", pvals, g.const(1))
    tp = g.col(top_p)
    inside = g.count(g.op("Less", g.op("Sub", cum, pvals), tp), keepdims=1)
    at = g.op("Sub", g.op("Max", inside, g.const([[1]])), g.const(1))
    threshold = g.op("GatherElements", pvals, at, axis=1)
    use_p = g.op("Less", tp, g.const(1.0, np.float32))
    kept = g.op("Mul", p, g.op("Cast", g.op("GreaterOrEqual", p, threshold), to=T.FLOAT))
    kept = g.op("Div", kept, g.op("ReduceSum", kept, g.const([1]), keepdims=1))
    p = g.op("Where", use_p, kept, p)
    short = g.op("And", use_p, g.op("And", g.op("Less", g.last(cum), tp), g.op("Less", m, vocab)))
    return p, g.op("Squeeze", short, g.const([1]))


def _blocks(g: _Graph, x: str, block: str) -> str:
    """[R, V] -> [R, V / block, block] (a view)."""
    blocks = g.op("Div", g.vocab(x), block)
    return g.op("Reshape", x, g.op("Concat", g.const([-1]), blocks, block, axis=0))


def _last_positive(g: _Graph, x: str) -> str:
    """[R, M] -> [R]: the index of the last entry > 0 (0 if none)."""
    index = g.op(
        "Range", g.const(0), g.op("Squeeze", g.op("Slice", g.op("Shape", x), g.const([1]), g.const([2]))), g.const(1)
    )
    marked = g.op("Where", g.op("Greater", x, g.const(0.0, np.float32)), index, g.const(0))
    return g.op("ReduceMax", marked, g.const([1]), keepdims=0)


def _argmax(g: _Graph, logits: str, block: str) -> str:
    """[R, V] -> [R]: the first index of the maximum, in two levels (ONNX Runtime's ArgMax reads a 150k row
    about 2x slower than its ReduceMax): the first block holding the maximum, then the first index in it."""
    x3 = _blocks(g, logits, block)
    first = g.op("ArgMax", g.op("ReduceMax", x3, g.const([2]), keepdims=0), axis=1, keepdims=1)  # [R, 1]
    inside = g.op("ArgMax", g.op("GatherND", x3, first, batch_dims=1), axis=1, keepdims=0)
    return g.op("Add", g.op("Mul", g.op("Squeeze", first, g.const([1])), block), inside)


def _sample(g: _Graph, weights: str, u: str, block: str) -> str:
    """[R, V] weights (>= 0), [R] uniforms -> [R] tokens by inverse CDF, in two levels: the block where the
    cumulative block sums pass u * total, then the position in it (no CumSum over the whole row). Never a
    token of weight 0: the choice is capped at the last block, and the last token in it, that has weight."""
    w3 = _blocks(g, weights, block)
    sums = g.op("ReduceSum", w3, g.const([2]), keepdims=0)  # [R, blocks]
    cum = g.op("CumSum", sums, g.const(1))
    at = g.op("Mul", g.col(u), g.last(cum))  # [R, 1]
    b = g.op("Min", g.count(g.op("LessOrEqual", cum, at)), _last_positive(g, sums))
    before = g.op("Concat", g.op("Mul", g.last(cum), g.const(0.0, np.float32)), cum, axis=1)  # [R, 1 + blocks]
    offset = g.op("GatherElements", before, g.col(b), axis=1)  # [R, 1]
    inside = g.op("GatherND", w3, g.col(b), batch_dims=1)  # [R, block]
    cum_in = g.op("Add", g.op("CumSum", inside, g.const(1)), offset)
    j = g.op("Min", g.count(g.op("LessOrEqual", cum_in, at)), _last_positive(g, inside))
    return g.op("Add", g.op("Mul", b, block), j)


def _confidence(g: _Graph, logits: str) -> str:
    """softmax(logits).max() (ONNX Runtime's Softmax is vectorised; its Exp op, on a 150k row, 4x slower)."""
    return g.op("ReduceMax", g.op("Softmax", logits, axis=-1), g.const([1]), keepdims=0)


def _filters(g: _Graph, rows: str):
    from onnx import TensorProto as T

    return (
        g.input("top_k", T.INT64, [rows]),
        g.input("top_p", T.FLOAT, [rows]),
        g.input("candidates", T.INT64, [1]),
    )


def pick_greedy():
    from onnx import TensorProto as T

    g = _Graph("pick_greedy")
    logits = g.input("logits", T.FLOAT, ["rows", "vocab"])
    block = g.input("block", T.INT64, [1])
    g.output(_argmax(g, logits, block), "token", T.INT64, ["rows"])
    g.output(_confidence(g, logits), "confidence", T.FLOAT, ["rows"])
    return g.model()


def pick_sampled(filtered: bool = False):
    from onnx import TensorProto as T

    g = _Graph("pick_filtered" if filtered else "pick_sampled")
    logits = g.input("logits", T.FLOAT, ["rows", "vocab"])
    block = g.input("block", T.INT64, [1])
    temperature = g.input("temperature", T.FLOAT, ["rows"])
    filters = _filters(g, "rows") if filtered else None
    greedy = g.input("greedy", T.BOOL, ["rows"])
    u = g.input("uniform", T.FLOAT, ["rows"])
    q_store = g.input("q_store", T.FLOAT, ["slots", "steps", "vocab"])
    q_index = g.input("q_index", T.INT64, ["rows", 2])
    p, short = _warp(g, logits, temperature, filters)
    drawn = _sample(g, p, u, block)
    drawn_p = g.op("Squeeze", g.op("GatherElements", p, g.col(drawn), axis=1), g.const([1]))
    g.output(g.op("Where", greedy, _argmax(g, logits, block), drawn), "token", T.INT64, ["rows"])
    g.output(g.op("Where", greedy, _confidence(g, logits), drawn_p), "confidence", T.FLOAT, ["rows"])
    if short is not None:
        g.output(short, "short", T.BOOL, ["rows"])
    # In place: the runtime binds q_store's buffer as this output too (ScatterND then writes only [R, V]).
    g.output(g.op("ScatterND", q_store, q_index, p), "q_store_out", T.FLOAT, ["slots", "steps", "vocab"])
    return g.model()


def _positions(g: _Graph, start: str, count: str, drafted: str) -> tuple[str, str, str, str]:
    """Per row the flat positions of its k + 1 logits [R, K + 1] (clamped to its own last one), the valid
    draft mask [R, K], the index range j [K] and K as a [1]."""
    k = g.op("Slice", g.op("Shape", drafted), g.const([1]), g.const([2]))
    j1 = g.op("Range", g.const(0), g.op("Squeeze", g.op("Add", k, g.const([1]))), g.const(1))
    j = g.op("Range", g.const(0), g.op("Squeeze", k), g.const(1))
    pos = g.op("Add", g.col(start), g.op("Min", g.op("Unsqueeze", j1, g.const([0])), g.col(count)))
    valid = g.op("Less", g.op("Unsqueeze", j, g.const([0])), g.col(count))
    return pos, valid, j, k


def _greedy_rule(g: _Graph, logits, block, pos, valid, drafted, k, rule: str = "exact") -> tuple[str, str]:
    best = g.op("Gather", _argmax(g, logits, block), pos)  # [R, K + 1]
    first_k = g.op("Slice", best, g.const([0]), k, g.const([1]))
    agree = g.op("Equal", first_k, drafted)
    if rule == "accept_all":
        agree = g.op("Or", agree, g.op("Not", agree))
    accepted = g.leading(g.op("And", agree, valid))
    nxt = g.op("Squeeze", g.op("GatherElements", best, g.col(accepted), axis=1), g.const([1]))
    return accepted, nxt


def _verify_inputs(g: _Graph) -> tuple[str, str, str, str, str]:
    from onnx import TensorProto as T

    return (
        g.input("logits", T.FLOAT, ["positions", "vocab"]),
        g.input("block", T.INT64, [1]),
        g.input("start", T.INT64, ["rows"]),
        g.input("count", T.INT64, ["rows"]),
        g.input("drafted", T.INT64, ["rows", "k"]),
    )


def verify_greedy(rule: str = "exact"):
    from onnx import TensorProto as T

    g = _Graph("verify_greedy")
    logits, block, start, count, drafted = _verify_inputs(g)
    pos, valid, _, k = _positions(g, start, count, drafted)
    accepted, nxt = _greedy_rule(g, logits, block, pos, valid, drafted, k, rule)
    g.output(accepted, "accepted", T.INT64, ["rows"])
    g.output(nxt, "next", T.INT64, ["rows"])
    return g.model()


def verify_sampled(rule: str = "exact", filtered: bool = False):
    from onnx import TensorProto as T

    if rule not in RULES:
        raise ValueError(f"rule {rule!r} is not one of {RULES}")
    g = _Graph("verify_filtered" if filtered else "verify_sampled")
    logits, block, start, count, drafted = _verify_inputs(g)
    temperature = g.input("temperature", T.FLOAT, ["positions"])
    filters = _filters(g, "positions") if filtered else None
    greedy = g.input("greedy", T.BOOL, ["rows"])
    lookup = g.input("lookup", T.BOOL, ["rows"])
    q_store = g.input("q_store", T.FLOAT, ["slots", "steps", "vocab"])
    q_slot = g.input("q_slot", T.INT64, ["rows"])
    u_accept = g.input("u_accept", T.FLOAT, ["rows", "k"])
    u_final = g.input("u_final", T.FLOAT, ["rows"])

    pos, valid, j, k = _positions(g, start, count, drafted)
    greedy_n, greedy_next = _greedy_rule(g, logits, block, pos, valid, drafted, k)

    p, short = _warp(g, logits, temperature, filters)
    vocab = g.vocab(logits)
    steps = g.op("Slice", g.op("Shape", q_store), g.const([1]), g.const([2]))
    last_step = g.op("Sub", steps, g.const([1]))
    # p(d_i) and q(d_i) for every draft: flat indices into p [N, V] and q_store [slots, steps, V].
    draft_pos = g.op("Slice", pos, g.const([0]), k, g.const([1]))
    p_x = g.op("Gather", g.flat(p), g.op("Add", g.op("Mul", draft_pos, vocab), drafted))
    q_row = g.op("Add", g.op("Mul", g.col(q_slot), steps), g.op("Unsqueeze", g.op("Min", j, last_step), g.const([0])))
    q_x = g.op("Gather", g.flat(q_store), g.op("Add", g.op("Mul", q_row, vocab), drafted))
    q_x = g.op("Where", g.col(lookup), g.const(1.0, np.float32), q_x)  # prompt lookup: one-hot q
    keep = g.op("Less", g.op("Mul", u_accept, q_x), p_x)
    if rule == "accept_all":
        keep = g.op("Or", keep, g.op("Not", keep))
    n = g.leading(g.op("And", keep, valid))
    # The residual at the first rejection (q is zero past the drafts: a full acceptance samples p itself).
    p_n = g.op("Gather", p, g.op("Add", start, n), axis=0)
    q_rows = g.op("Reshape", q_store, g.op("Concat", g.const([-1]), vocab, axis=0))
    q_n = g.op(
        "Gather",
        q_rows,
        g.op("Add", g.op("Mul", q_slot, g.op("Squeeze", steps)), g.op("Min", n, g.op("Squeeze", last_step))),
        axis=0,
    )
    d_n = g.op("GatherElements", drafted, g.col(g.op("Min", n, g.op("Sub", g.op("Squeeze", k), g.const(1)))), axis=1)
    one_hot = g.op("OneHot", g.op("Squeeze", d_n, g.const([1])), g.op("Squeeze", vocab), g.const([0, 1], np.float32))
    q_n = g.op("Where", g.col(lookup), one_hot, q_n)
    q_n = g.op("Mul", q_n, g.col(g.op("Cast", g.op("Less", n, count), to=T.FLOAT)))
    if rule == "residual_p":
        q_n = g.op("Mul", q_n, g.const(0.0, np.float32))
    r = g.op("Relu", g.op("Sub", p_n, q_n))
    some = g.op("Greater", g.op("ReduceSum", r, g.const([1]), keepdims=1), g.const(0.0, np.float32))
    drawn = _sample(g, g.op("Where", some, r, p_n), u_final, block)

    g.output(g.op("Where", greedy, greedy_n, n), "accepted", T.INT64, ["rows"])
    g.output(g.op("Where", greedy, greedy_next, drawn), "next", T.INT64, ["rows"])
    if short is not None:
        g.output(short, "short", T.BOOL, ["positions"])
    return g.model()


BUILDERS = {
    "pick_greedy": pick_greedy,
    "pick_sampled": pick_sampled,
    "pick_filtered": lambda: pick_sampled(filtered=True),
    "verify_greedy": verify_greedy,
    "verify_sampled": verify_sampled,
    "verify_filtered": lambda: verify_sampled(filtered=True),
}


def write_samplers(out: Path) -> list[str]:
    """Write the sampler graphs into out/sampler/; return their names relative to `out`."""
    from onnx import checker, save_model

    (out / FOLDER).mkdir(parents=True, exist_ok=True)
    names = []
    for name in GRAPHS:
        model = BUILDERS[name]()
        checker.check_model(model, full_check=True)
        save_model(model, str(out / FOLDER / f"{name}.onnx"))
        names.append(f"{FOLDER}/{name}.onnx")
    return names
