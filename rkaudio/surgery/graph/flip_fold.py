"""Fold a normalizing flow's channel flips into the weights around them.

Why the NPU needs it: VITS's reverse flow flips channels between coupling layers (`torch.flip`,
exported as a Slice with step -1), and RKNN places every such Slice on the CPU, costing two
NPU<->CPU round trips per flip. A flip in front of a coupling layer is a channel permutation next
to a Split and convolutions, so it folds exactly: the Split's halves swap, the `pre` conv reads its
input channels reversed, the `post` conv writes its output channels reversed (per half if it also
predicts log-scales), and the Concat swaps its inputs, which leaves the coupling's output reversed.
Two flips then cancel; a reversal left at the end of the flow folds into the next conv's input
channels (through channel-broadcast Muls such as the frame mask). The result is exact: only weights
are permuted."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from rkaudio.core.onnx_graph import GraphIndex, constant_value, inferred_dims, is_reversal, node_attr


class FlipFoldError(ValueError):
    """A flip sits somewhere this pass cannot fold exactly."""


def _channel_flip(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """A full reversal of axis 1 (the channels of a [1, C, N] tensor)."""
    if not is_reversal(index, node):
        return False
    axes = constant_value(index, node.input[3]) if len(node.input) > 3 and node.input[3] else None
    steps = constant_value(index, node.input[4])
    return axes is not None and list(np.ravel(axes)) in ([1], [-2]) and list(np.ravel(steps)) == [-1]


def fold_flips(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove every channel-flip Slice of the flow by permuting the adjacent convs' weights (exact)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    shapes = _channel_dims(out)
    reversed_tensors: set[str] = set()   # tensors that now hold the channel reversal of their old value

    def permute(node: onnx.NodeProto, position: int, fn) -> None:
        """Give `node` its own permuted copy of its constant input (exporters share equal weights)."""
        name = node.input[position]
        value = _weight_value(GraphIndex(out), name)
        if value is None:
            raise FlipFoldError(f"{node.op_type} {node.name!r} input {name} is not a constant; cannot fold a flip into it")
        copy = f"{name}_flipfold_{len(graph.initializer)}"
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(fn(value)), copy))
        node.input[position] = copy

    def rewire(old: str, new: str) -> None:
        for node in graph.node:
            node.input[:] = [new if i == old else i for i in node.input]
        for output in graph.output:
            if output.name == old:
                raise FlipFoldError(f"flip output {old} is a graph output")

    changed = True
    while changed:  # one flip per round: every round re-indexes the rewired graph
        changed = False
        idx = GraphIndex(out)
        for flip in idx.nodes:
            if not _channel_flip(idx, flip):
                continue
            source, result = flip.input[0], flip.output[0]
            # Drop the flip: its consumers read the unflipped tensor, marked reversed (or un-reversed).
            graph.node.remove(flip)
            rewire(result, source)
            if source in reversed_tensors:
                reversed_tensors.discard(source)
            else:
                reversed_tensors.add(source)
                _resolve(out, source, reversed_tensors, permute, shapes)
            changed = True
            break
    if reversed_tensors:
        raise FlipFoldError(f"channel reversals left unresolved at {sorted(reversed_tensors)}")
    return out


def _resolve(model, tensor, reversed_tensors, permute, shapes) -> None:
    """Push the reversal of `tensor` downstream until it is absorbed by weights or cancelled by a flip."""
    idx = GraphIndex(model)
    consumers = idx.consumers.get(tensor, [])
    if any(_channel_flip(idx, c) for c in consumers):
        if len(consumers) != 1:
            raise FlipFoldError(f"{tensor} feeds a flip and other nodes")
        return  # the next flip cancels it (handled by the caller's next round)
    reversed_tensors.discard(tensor)
    for node in consumers:
        if node.op_type == "Split" and len(node.output) == 2:
            _fold_coupling(model, idx, node, reversed_tensors, permute, shapes)
        elif node.op_type == "Conv" and node.input[0] == tensor and int(node_attr(node, "group", 1)) == 1:
            permute(node, 1, lambda w: w[:, ::-1])
        elif node.op_type == "Mul" and all(i == tensor or shapes.get(i) == 1 for i in node.input):
            reversed_tensors.add(node.output[0])
            _resolve(model, node.output[0], reversed_tensors, permute, shapes)
        else:
            raise FlipFoldError(f"cannot fold a channel flip into {node.op_type} {node.name!r}")


def _fold_coupling(model, idx: GraphIndex, split: onnx.NodeProto, reversed_tensors, permute, shapes) -> None:
    """A coupling layer whose input is reversed: swap halves, permute pre/post weights, swap the Concat."""
    first, second = split.output
    sizes = constant_value(idx, split.input[1]) if len(split.input) > 1 and split.input[1] else None
    if sizes is not None and len(set(np.ravel(sizes).tolist())) != 1:
        raise FlipFoldError(f"split {split.name!r} has unequal halves {sizes}; a flip does not map half to half")
    concats = [c for c in idx.consumers.get(first, []) if c.op_type == "Concat"]
    if len(concats) != 1 or concats[0].input[0] != first:
        raise FlipFoldError(f"split {split.name!r} is not a coupling layer (no Concat of its first half)")
    concat = concats[0]
    # Reversed input: first half <- reversed second half, second half <- reversed first half.
    split.output[:] = [second, first]
    for node in idx.consumers.get(first, []):
        if node is concat:
            continue
        if node.op_type != "Conv" or int(node_attr(node, "group", 1)) != 1:
            raise FlipFoldError(f"coupling half {first} feeds {node.op_type} {node.name!r}, expected the pre conv")
        permute(node, 1, lambda w: w[:, ::-1])
    # The transformed half: reverse the channels of every conv that feeds it besides the half itself.
    transformed = concat.input[1]
    path = idx.descendants({second})
    for conv in _feeding_convs(idx, transformed, path, set(split.output), shapes):
        halves = 2 if shapes.get(conv.output[0]) == 2 * shapes.get(second, -1) else 1
        flip_out = lambda w, h=halves: np.concatenate([p[::-1] for p in np.split(w, h, axis=0)], axis=0)
        permute(conv, 1, flip_out)
        if len(conv.input) > 2 and conv.input[2]:
            permute(conv, 2, flip_out)
    concat.input[:] = [concat.input[1], concat.input[0]]
    reversed_tensors.add(concat.output[0])
    _resolve(model, concat.output[0], reversed_tensors, permute, shapes)


def _feeding_convs(idx: GraphIndex, tensor: str, path: set[str], stop: set[str],
                   shapes: dict[str, int]) -> list[onnx.NodeProto]:
    """Nearest Conv ancestors of the non-`path` operands along the transformed half's path."""
    found, seen, stack = [], set(), [tensor]
    while stack:
        name = stack.pop()
        if name in seen or name in stop:
            continue
        seen.add(name)
        node = idx.producer.get(name)
        if node is None:
            continue
        if node.op_type == "Conv" and name not in path:
            found.append(node)
            continue
        if node.op_type in ("Shape", "ConstantOfShape") or shapes.get(name) == 1:
            continue  # shape-only or channel-broadcast (mask): channel order does not matter
        stack.extend(i for i in node.input if i and not idx.is_constant(i))
    unique = {id(n): n for n in found}
    return list(unique.values())


def _weight_value(index: GraphIndex, name: str):
    """Value of a constant input, following Identity nodes to their initializer or Constant."""
    node = index.producer.get(name)
    while node is not None and node.op_type == "Identity":
        name, node = node.input[0], index.producer.get(node.input[0])
    return constant_value(index, name)


def _channel_dims(model: onnx.ModelProto) -> dict[str, int]:
    """Axis-1 size of each tensor typed that far by shape inference and of each initializer (1 below rank 2)."""
    dims = {name: shape[1] for name, shape in inferred_dims(model) if len(shape) >= 2 and shape[1] is not None}
    dims.update((init.name, init.dims[1] if len(init.dims) >= 2 else 1) for init in model.graph.initializer)
    return dims
