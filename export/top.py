"""The model graph's own greedy pick: each logits row's argmax and its probability, as extra outputs.

A greedy round then needs no run after the model's: the draft step's token and confidence and the verify
pass's tokens come out of the model runs themselves (specrt.engine.decide reads them). Built from the
same argmax and confidence as the sampler graph `pick_greedy` (export/sampler.py), so both give the same
ids from the same logits.
"""

from __future__ import annotations

import math

from .sampler import _argmax, _confidence, _Graph

TOP_MODE, TOP_TOKEN, TOP_CONFIDENCE = "top_mode", "top_token", "top_confidence"


def add_top(model, logits: str, vocab: int) -> None:
    """Give a model graph the greedy pick of its own logits: outputs top_token [N] (each logits row's argmax,
    the first index of the maximum) and top_confidence [N] (its probability), for the N = B x keep rows its
    logits output holds, computed only when the input top_mode [1] asks (0: neither, zeros out; 1: the
    token; 2: both). A greedy round then reads its ids from the model's own run, with no sampler run after
    it; a sampled round asks for neither and pays nothing (ONNX Runtime runs every node of a graph whatever
    outputs are bound, so the work sits in If branches: the softmax of one 151,936-token row costs about as
    much as a sampler run's host overhead). Argmax and confidence are computed as pick_greedy computes them."""
    from onnx import TensorProto as T
    from onnx import helper

    g = _Graph("top", prefix="top/")
    mode = g.input(TOP_MODE, T.INT64, [1])
    flat = g.op("Reshape", logits, g.const([-1, vocab]))  # [N, V] whatever the flavour's logits shape
    rows = g.op("Slice", g.op("Shape", flat), g.const([0]), g.const([1]))
    size = g.const([math.gcd(vocab, 128)])

    def branch(name: str, elem: int, build) -> object:
        b = _Graph(name, prefix=f"top/{name}/")
        b.output(build(b), f"top/{name}/out", elem, ["rows"])
        return helper.make_graph(b.nodes, name, [], b.outputs, b.inits)

    def zeros(elem: int):
        return lambda b: b.op("ConstantOfShape", rows, value=helper.make_tensor("zero", elem, [1], [0]))

    for out, elem, least, compute in (
        (TOP_TOKEN, T.INT64, 1, lambda b: _argmax(b, flat, size)),
        (TOP_CONFIDENCE, T.FLOAT, 2, lambda b: _confidence(b, flat)),
    ):
        g.op(
            "If",
            g.op("GreaterOrEqual", mode, g.const([least])),
            out=out,
            then_branch=branch(f"{out}_then", elem, compute),
            else_branch=branch(f"{out}_else", elem, zeros(elem)),
        )
        g.outputs.append(helper.make_tensor_value_info(out, elem, ["rows"]))
    model.graph.node.extend(g.nodes)
    model.graph.initializer.extend(g.inits)
    model.graph.input.extend(g.inputs)
    model.graph.output.extend(g.outputs)
