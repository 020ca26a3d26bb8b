"""Pin input shapes and constant-fold with onnxslim.

Why: RKNN has no dynamic shapes, and `Shape -> ConstantOfShape/Range -> Slice` sizing glue that
exporters emit makes `rknn.build` abort inside fold_constant with no traceback. Once every input
shape is fixed, that glue is constant and folds away."""
from __future__ import annotations

import onnx

from rkaudio.core.onnx_graph import constant_values, drop_unused_initializers, static_shapes


def pin_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """Set the named inputs' dims to fixed values (other inputs untouched); no folding."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    known = {i.name for i in out.graph.input}
    unknown = set(shapes) - known
    if unknown:
        raise ValueError(f"no graph input named {sorted(unknown)}; inputs are {sorted(known)}")
    for graph_input in out.graph.input:
        if graph_input.name in shapes:
            dims = graph_input.type.tensor_type.shape.dim
            wanted = shapes[graph_input.name]
            if len(dims) != len(wanted):
                raise ValueError(f"input {graph_input.name} has rank {len(dims)}, asked to pin {wanted}")
            for dim, value in zip(dims, wanted):
                dim.ClearField("dim_param")
                dim.dim_value = int(value)
    return out


def fold_fixed(model: onnx.ModelProto, shapes: dict[str, list[int]] | None = None) -> onnx.ModelProto:
    """Pin `shapes` (if given), then constant-fold and simplify with onnxslim; metadata is kept."""
    import onnxslim

    pinned = pin_input_shapes(model, shapes or {})
    props = [(p.key, p.value) for p in pinned.metadata_props]
    folded = _fold_constant_nodes(onnxslim.slim(pinned))
    # onnx 1.23 stamps IR 14, which onnxruntime 1.26 and the toolkit's onnx 1.16 cannot read;
    # the ops are unchanged, so the source's IR version stays valid.
    folded.ir_version = pinned.ir_version
    del folded.metadata_props[:]
    for key, value in props:
        entry = folded.metadata_props.add()
        entry.key, entry.value = key, value
    return folded


def _fold_constant_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Evaluate every node whose inputs are all constant and store its outputs as initializers.

    onnxslim (GraphSurgeon) leaves some such nodes, e.g. `ConstantOfShape` of a folded `Shape`."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    constants = constant_values(graph)  # Constant nodes are folded to initializers below all the same
    opsets = list(out.opset_import)
    kept = []
    for node in graph.node:
        inputs = [name for name in node.input if name]
        foldable = node.op_type == "Constant" or (inputs and all(name in constants for name in inputs))
        if not foldable or node.domain not in ("", "ai.onnx"):
            kept.append(node)
            continue
        single = onnx.helper.make_model(
            onnx.helper.make_graph([node], "fold", [], [onnx.helper.make_empty_tensor_value_info(o) for o in node.output]),
            opset_imports=opsets,
        )
        values = ReferenceEvaluator(single).run(None, {name: constants[name] for name in inputs})
        for name, value in zip(node.output, values):
            constants[name] = value
            graph.initializer.append(numpy_helper.from_array(value, name))
    del graph.node[:]
    graph.node.extend(kept)
    return drop_unused_initializers(out)


def op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    """Node count per op type (for before/after reports)."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def fold_static_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace `Shape` of statically shaped tensors by constants and evaluate what then becomes constant,
    with onnx's reference evaluator, until nothing changes.

    Why: run before `fold_fixed` on graphs whose pad amounts are computed from shapes (VITS relative
    attention): onnxslim 0.1.98 folds the Shape -> Concat -> Reshape -> Slice(step -1) -> Transpose pad glue
    of the Piper encoder to the wrong pads ([0,0,127,0,0,0] instead of [0,0,0,0,0,127] at N=128)."""
    import numpy as np
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    while True:
        static = static_shapes(out, constants=False, outputs=False)
        kept, replaced = [], 0
        for node in out.graph.node:
            if node.op_type == "Shape" and not node.attribute and node.input[0] in static:
                out.graph.initializer.append(
                    numpy_helper.from_array(np.array(static[node.input[0]], dtype=np.int64), node.output[0]))
                replaced += 1
            else:
                kept.append(node)
        del out.graph.node[:]
        out.graph.node.extend(kept)
        before = len(out.graph.node)
        out = _fold_constant_nodes(out)
        if not replaced and len(out.graph.node) == before:
            return out
