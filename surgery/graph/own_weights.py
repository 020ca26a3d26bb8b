"""Give every Conv and ConvTranspose its own weight initializer.

Why the NPU needs it: rknn-toolkit2 2.3.2 crashes while compiling two ConvTranspose layers that read one weight
initializer (SIGSEGV in its layout-match pass; the same graph with the weight copied per layer builds), and
torch's exporter and onnxslim merge equal constants into one. The Qwen3 step's cache-tail selectors are equal
0/1 weights wherever two row convs have the same channels and context. Exact: only names change."""
from __future__ import annotations

import onnx

CONV_TYPES = ("Conv", "ConvTranspose")


def own_conv_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """Copy a weight initializer read by more than one node once per Conv/ConvTranspose that reads it, so no conv
    shares its weight with another node; the original stays for the first reader."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    seen: set[str] = set()
    for node in graph.node:
        if node.op_type not in CONV_TYPES or len(node.input) < 2:
            continue
        weight = node.input[1]
        if weight not in initializers or readers[weight] < 2:
            continue
        if weight not in seen:  # the first reader keeps the original
            seen.add(weight)
            continue
        copy = onnx.TensorProto()
        copy.CopyFrom(initializers[weight])
        copy.name = f"{weight}_for_{node.name or node.output[0]}"
        graph.initializer.append(copy)
        node.input[1] = copy.name
    return out
