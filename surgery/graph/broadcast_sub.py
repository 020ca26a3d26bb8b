"""Subtract a computed tensor broadcast along a long axis as an Add of its negation.

Why the NPU needs it: rk3566 lowers Sub(a, b) with a computed b broadcast along an axis of a (the masked instance
norm's x - mean, mean [1, C, 1]) as an Expand of b to a's shape and then a Sub, and that Expand's length field is
11 bits (REGTASK lite@0x1028, limit 0x7ff: 8 lines per Sub at 8161 samples); Add broadcasts natively, and the
compiler folds the Neg of a pooled b into the pooling convs. Exact in every float format: -b is exact and IEEE
rounds a + (-b) as it rounds a - b."""
from __future__ import annotations

import onnx
from onnx import helper

from core.onnx_graph import GraphIndex, static_shapes


def _broadcast_length(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> int:
    """The longest axis of a along which b (numpy broadcasting) is repeated; 0 when b is not repeated."""
    shape_b = (1,) * (len(shape_a) - len(shape_b)) + tuple(shape_b)
    return max((a for a, b in zip(shape_a, shape_b) if b == 1 and a > 1), default=0)


def add_negated_broadcast(model: onnx.ModelProto, limit: int) -> onnx.ModelProto:
    """Rewrite every Sub(a, b) whose computed (non-constant) b is broadcast along an axis of a longer than `limit`
    as Add(a, Neg(b)). Constant subtrahends stay: the compiler folds them (the Snake round shift's Subs log no
    REGTASK line)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    index = GraphIndex(out)
    shapes = static_shapes(out)
    nodes = []
    for node in out.graph.node:
        a, b = (node.input[:2] if node.op_type == "Sub" else ("", ""))
        if node.op_type == "Sub" and not index.is_constant(b) and a in shapes and b in shapes \
                and _broadcast_length(shapes[a], shapes[b]) > limit:
            negated = f"{b}_negated_for_{node.output[0]}"
            nodes.append(helper.make_node("Neg", [b], [negated], name=f"{node.name}_neg"))
            nodes.append(helper.make_node("Add", [a, negated], list(node.output), name=f"{node.name}_as_add"))
        else:
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
