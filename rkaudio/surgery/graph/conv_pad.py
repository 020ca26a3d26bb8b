"""Cap a 1-D Conv's own padding and concatenate the excess as constant zeros.

Why the NPU needs it: rknn.build compiles pads up to 15 inside the conv, but splits a larger pad
(HiFi-GAN's kernel-11 dilation-5 conv pads 25) into a separate Pad layer, and that Pad lands on the
CPU once the padded axis passes 65535 (a 256-slice window reaches 65536 samples at the last level).
A Concat of zeros is the same padding and stays on the NPU (measured on rk3588, toolkit 2.3.2).
General: it knows no family (Inflect and any HiFi-GAN-style decoder with wide dilated convs use it)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.core.onnx_graph import node_attr

# Largest pad rknn.build keeps inside a conv (measured: 15 stays, 25 becomes a Pad layer).
MAX_CONV_PAD = 15


def cap_conv_padding(model: onnx.ModelProto, max_pad: int = MAX_CONV_PAD,
                     padded_kernel_limit: int | None = None) -> onnx.ModelProto:
    """Every 1-D Conv with a pad above `max_pad` reads Concat(zeros, x, zeros) and pads only `max_pad`, and one with
    a kernel wider than `padded_kernel_limit` (rkaudio.board.soc.PADDED_KERNEL_LIMIT) pads nothing itself:
    the same output, with no Pad layer for the compiler to place on the CPU."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    weights = {init.name: init for init in graph.initializer}
    zeros: dict[tuple[int, int], str] = {}
    nodes = []
    for node in graph.node:
        pads = node_attr(node, "pads")
        kernel = int(weights[node.input[1]].dims[-1]) if node.op_type == "Conv" and node.input[1] in weights else 0
        own_pad = 0 if padded_kernel_limit is not None and kernel > padded_kernel_limit else max_pad
        if node.op_type != "Conv" or not pads or len(pads) != 2 or max(pads) <= own_pad:
            nodes.append(node)
            continue
        if node_attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or node.input[1] not in weights:
            raise ValueError(f"Conv {node.name!r} has explicit pads but auto_pad or a computed weight")
        channels = int(weights[node.input[1]].dims[1]) * int(node_attr(node, "group", 1))
        extra = [max(p - own_pad, 0) for p in pads]
        pieces = []
        for side, count in zip(("begin", "end"), extra):
            if count:
                key = (channels, count)
                if key not in zeros:
                    zeros[key] = f"conv_pad_zeros_c{channels}_n{count}"
                    graph.initializer.append(numpy_helper.from_array(np.zeros((1, channels, count), np.float32),
                                                                     zeros[key]))
                pieces.append((side, zeros[key]))
        concat_inputs = [n for s, n in pieces if s == "begin"] + [node.input[0]] + [n for s, n in pieces if s == "end"]
        padded = f"{node.input[0]}_padded_for_{node.name or node.output[0]}"
        nodes.append(helper.make_node("Concat", concat_inputs, [padded], axis=2, name=f"{node.name}_pad_concat"))
        conv = onnx.NodeProto()
        conv.CopyFrom(node)
        conv.input[0] = padded
        for attr in conv.attribute:
            if attr.name == "pads":
                attr.ints[:] = [p - e for p, e in zip(pads, extra)]
        nodes.append(conv)
    del graph.node[:]
    graph.node.extend(nodes)
    return out
