"""The fp32 floor: how close an fp32 computation of a checkpoint's weights comes to the same computation in
float64. No two fp32 computations of those weights (a traced graph and its source, a windowed decode and a full
one) can be expected to agree better than that, so an export gate comparing two such computations is held to
`floor_threshold`: its fixed level, or the floor less `FLOOR_MARGIN_DB` where that is lower. A checkpoint with a
wide dynamic range (a held-out real-shape Qwen3 snapshot: 78.4 dB) then passes a faithful export, while a
conversion fault, which costs tens of dB below the floor, still fails.

For a checkpoint that is an ONNX graph (Piper's voice, Inflect's decode.onnx) the floor is its onnxruntime fp32
run against `float64_run`: the same graph with every float tensor made double, run by the onnx reference
evaluator (onnxruntime has no double Conv, ConvTranspose or LeakyRelu CPU kernels) with its convolutions
replaced (`_conv_ops`: the evaluator's own are Python loops, 16 s for 40 Piper slices)."""
from __future__ import annotations

import numpy as np

# Two fp32 computations each sit about the floor from exact, so their difference sits about 3 dB under it when
# the roundings are independent, and one computation's rounding need not match the reference's: faithful exports
# measure from 2.4 dB above their floor (Kokoro's embedded model, onnxruntime 127.0 dB against a torch fp32 floor of
# 124.6) to 6.1 dB under it (a small Kokoro with its instance norms fed a 100x offset, whose onnxruntime reductions
# round worse than torch's). Every planted fault of #14 lands 20 dB or more under its floor (Qwen3's K/V history
# one row short: 104.1 dB against 124.3; Piper's context of 24 slices 35 dB under; the rest 50-120 dB under).
# 10 dB sits between the two with room on both sides.
FLOOR_MARGIN_DB = 10.0


def floor_threshold(fixed_db: float, floor_db: float) -> float:
    """The gate's threshold: `fixed_db`, or the weights' fp32 floor less FLOOR_MARGIN_DB where that is lower."""
    return min(fixed_db, floor_db - FLOOR_MARGIN_DB)


def floor_detail(fixed_db: float, floor_db: float) -> str:
    """How `floor_threshold` was set, for a verdict's detail."""
    return (f"the weights' fp32 floor is {floor_db:.1f} dB (threshold: {fixed_db:g} dB, or that floor - "
            f"{FLOOR_MARGIN_DB:g} dB where lower)")


def float64_model(model):
    """`model` with every float tensor (initializers, constants, Cast targets, graph inputs and outputs) made
    double (a new model)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph

    def double(tensor):
        return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)

    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT:
            graph.initializer[index].CopyFrom(double(tensor))
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == TensorProto.FLOAT:
                attribute.t.CopyFrom(double(attribute.t))
            elif node.op_type == "Cast" and attribute.name == "to" and attribute.i == TensorProto.FLOAT:
                attribute.i = TensorProto.DOUBLE
    for value in [*graph.input, *graph.output]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    del graph.value_info[:]  # the fp32 types inferred before would contradict the double ones
    return out


def _conv_ops():
    """Conv and ConvTranspose for the onnx reference evaluator in the inputs' dtype: Conv as one BLAS product
    over the input's sliding windows (torch's float64 conv is a direct loop, 8 s for 120 Inflect slices),
    ConvTranspose by torch (few calls, at the low rates)."""
    from onnx.reference.op_run import OpRun

    def explicit(op, x, pads, strides, dilations, auto_pad):
        spatial = x.ndim - 2
        if auto_pad not in (None, "NOTSET", b"NOTSET"):
            raise NotImplementedError(f"{op} auto_pad={auto_pad!r}: only explicit pads are run in float64")
        pads = list(pads) if pads is not None else [0] * 2 * spatial
        return list(strides or [1] * spatial), list(dilations or [1] * spatial), pads[:spatial], pads[spatial:]

    class Conv(OpRun):
        def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, pads=None,
                 strides=None):
            strides, dilations, begin, end = explicit("Conv", X, pads, strides, dilations, auto_pad)
            spatial, group = X.ndim - 2, group or 1
            X = np.pad(X, [(0, 0), (0, 0), *zip(begin, end)])
            extents = [(k - 1) * d + 1 for k, d in zip(W.shape[2:], dilations)]
            windows = np.lib.stride_tricks.sliding_window_view(X, extents, axis=tuple(range(2, 2 + spatial)))
            windows = windows[(slice(None), slice(None), *(slice(None, None, s) for s in strides),
                               *(slice(None, None, d) for d in dilations))]  # [N, C, *out, *kernel]
            per_in, per_out = W.shape[1], W.shape[0] // group
            kernel_axes = list(range(2 + spatial, 2 + 2 * spatial))
            parts = [np.tensordot(windows[:, g * per_in:(g + 1) * per_in], W[g * per_out:(g + 1) * per_out],
                                  axes=([1, *kernel_axes], [1, *range(2, 2 + spatial)])) for g in range(group)]
            out = np.moveaxis(np.concatenate(parts, axis=-1), -1, 1)  # [N, O, *out]
            if B is not None:
                out = out + B.reshape(1, -1, *[1] * spatial)
            return (out.astype(X.dtype),)

    class ConvTranspose(OpRun):
        def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None, kernel_shape=None,
                 output_padding=None, output_shape=None, pads=None, strides=None):
            import torch
            import torch.nn.functional as F

            strides, dilations, begin, end = explicit("ConvTranspose", X, pads, strides, dilations, auto_pad)
            if output_shape is not None:
                raise NotImplementedError("ConvTranspose output_shape: only explicit pads are run in float64")
            spatial = X.ndim - 2
            # torch crops its `padding` symmetrically: run it uncropped (output_padding lands at the end, as in
            # ONNX) and crop each side here
            with torch.no_grad():
                full = getattr(F, f"conv_transpose{spatial}d")(
                    torch.from_numpy(np.array(X)), torch.from_numpy(np.array(W)),  # copies: read-only arrays
                    None if B is None else torch.from_numpy(np.array(B)), stride=strides, padding=0,
                    output_padding=list(output_padding or [0] * spatial), groups=group or 1,
                    dilation=dilations).numpy()
            return (full[(slice(None), slice(None), *(slice(b, full.shape[2 + i] - e)
                                                      for i, (b, e) in enumerate(zip(begin, end))))],)

    return [Conv, ConvTranspose]


def float64_run(model, feeds: dict) -> dict:
    """Every output of `model` computed in float64 (`float64_model`, by the onnx reference evaluator), from
    `feeds` made float64."""
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(float64_model(model), new_ops=_conv_ops())
    names = [value.name for value in model.graph.output]
    values = {"": None, **evaluator.rt_inits_}  # "": an omitted optional input
    values.update({name: np.asarray(value, np.float64) if np.asarray(value).dtype.kind == "f" else value
                   for name, value in feeds.items()})
    # The evaluator's own run() keeps every intermediate to the end: on joe's 1053-slice white-noise latent (the
    # W=301 self-check) its host RSS peaked 3.4 GB over the start, this loop's, dropping each tensor after its last
    # reader, 1.3 GB, with bit-identical output.
    kept, last_read = {"", *names}, {}
    for position, node in enumerate(evaluator.rt_nodes_):
        for name in [*node.input, *_subgraph_reads(node.onnx_node)]:
            last_read[name] = position
    for position, node in enumerate(evaluator.rt_nodes_):
        inputs = [values[name] for name in node.input]
        outputs = node.run(*inputs, context=values) if node.need_context() else node.run(*inputs)
        values.update(zip(node.output, outputs))
        for name in [*node.input, *node.output]:
            if last_read.get(name, -1) <= position and name not in kept and name in values:
                del values[name]
    return {name: values[name] for name in names}


def _subgraph_reads(node) -> list[str]:
    """Every tensor name read inside `node`'s subgraphs (If / Loop / Scan bodies read outer tensors by name)."""
    import onnx

    reads = []
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for graph in graphs:
            for inner in graph.node:
                reads += [*inner.input, *_subgraph_reads(inner)]
    return reads


def floor_verdict(name: str, value: float, fixed_db: float, floor_db: float, detail: str):
    """`value` (dB) >= `floor_threshold(fixed_db, floor_db)`, the floor said in the detail."""
    from rkaudio.board.verdict import at_least

    return at_least(name, value, floor_threshold(fixed_db, floor_db), "dB",
                    f"{detail}; {floor_detail(fixed_db, floor_db)}")
