"""Whether TensorRT's ONNX parser (10.15+) takes a bundle's model graph: the reasons it would not, read off the
graph the exporter wrote, for the manifest (`Manifest.tensorrt`) and so for `specrt inspect` and a load with
`--device tensorrt`.

What the parser takes (its importers for the operators the standard graph uses):
- `TensorScatter`: 4-D tensors, axis -2 (TensorRT's KV-cache update layer, whose cache input and output
  share memory: the runtime binds each layer's buffer as both);
- `Attention`: 4-D Q, K, V and mask, no past / present, one output;
- `RotaryEmbedding`: int64 position ids;
- `DequantizeLinear`: zero point 0 (symmetric weights); block-wise scales only for int4 in blocks of 64 or
  128 (int4 in blocks of 32 and block-wise int8 are refused);
- no com.microsoft operator (GroupQueryAttention, MatMulNBits, ...): it has no importer for them.
The graph is read without its weights (only the shapes and types of initializers are needed).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

# The export flags that make a graph TensorRT takes (named in every refusal).
FIX = (
    "export with --graph standard --weights qdq --symmetric and either no --quant (fp32/fp16) or --quant int4 "
    "--block-size 128 (or 64) with --lm-head int4 or fp32"
)
BLOCKS = (64, 128)
_INT4, _UINT4, _INT8, _UINT8, _INT64 = 22, 21, 3, 2, 7  # onnx.TensorProto data types


def check_file(path: str | Path) -> list[str]:
    """The reasons TensorRT's parser would refuse the ONNX file at `path` (weights not read)."""
    import onnx

    return check(onnx.load(str(path), load_external_data=False))


def check(model) -> list[str]:
    """The reasons TensorRT's parser would refuse `model` (an onnx.ModelProto), each once with its count;
    empty when it takes it."""
    import onnx

    graph = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    ranks, types = {}, {}
    for v in [*graph.input, *graph.value_info, *graph.output]:
        t = v.type.tensor_type
        types[v.name] = t.elem_type
        if t.HasField("shape"):
            ranks[v.name] = len(t.shape.dim)
    for init in graph.initializer:
        ranks[init.name], types[init.name] = len(init.dims), init.data_type
    reasons: Counter[str] = Counter()
    for node in _nodes(graph):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.type != a.GRAPH}
        reasons.update(_node(node, ranks, types, attrs))
    return [f"{why} ({n} nodes)" if n > 1 else why for why, n in reasons.items()]


def _nodes(graph):
    """Every node, those inside If / Loop branches too (the greedy pick sits in If branches)."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == a.GRAPH:
                yield from _nodes(a.g)


def _node(node, ranks: dict, types: dict, attrs: dict) -> list[str]:
    op, domain = node.op_type, node.domain
    if domain not in ("", "ai.onnx"):
        return [f"{domain}.{op}: TensorRT has no importer for it"]
    inputs = [name for name in node.input]
    out = []
    if op == "TensorScatter":
        if attrs.get("axis", -2) != -2:
            out.append(f"TensorScatter with axis {attrs['axis']}: TensorRT's KV-cache update takes axis -2 only")
        if any(ranks.get(x, 4) != 4 for x in inputs[:2]):
            out.append("TensorScatter on tensors that are not 4-D")
    elif op == "Attention":
        if any(ranks.get(x, 4) != 4 for x in inputs[:4] if x):
            out.append("Attention with Q, K, V or mask not 4-D")
        if any(inputs[4:]) or sum(1 for x in node.output if x) > 1:
            out.append("Attention with a past or present KV cache (TensorRT takes one output)")
    elif op == "RotaryEmbedding":
        if len(inputs) > 3 and inputs[3] and types.get(inputs[3], _INT64) != _INT64:
            out.append("RotaryEmbedding with position ids that are not int64")
    elif op == "DequantizeLinear":
        weight = types.get(inputs[0])
        blocked = attrs.get("block_size", 0) > 0
        if len(inputs) > 2 and inputs[2]:
            out.append("DequantizeLinear with zero points (asymmetric weights): TensorRT takes zero point 0")
        if blocked and weight in (_INT8, _UINT8):
            out.append("block-wise int8 weights: TensorRT takes block scales only for int4")
        elif blocked and weight in (_INT4, _UINT4) and attrs["block_size"] not in BLOCKS:
            out.append(f"int4 weights in blocks of {attrs['block_size']}: TensorRT takes blocks of 64 or 128")
    return out
