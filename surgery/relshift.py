"""Relative-position attention (VITS/Piper): find the relative-shift chains and rewrite them as banded ops.

Why: with the token axis pinned, every relative-attention layer keeps two `Pad + Reshape + Pad + Reshape +
Slice` chains that skew [N, 2N-1] relative slabs by one step per query row. The NPU computes those chains as
garbage (uninitialised memory, NaN, +-65504) while the simulator looks fine, so they must leave the graph.
Only the 2w+1 diagonals inside the attention window are non-zero, so both chains become products with one
shared 0/1 band constant of 2w+1 diagonals x N^2 (MatMul, Mul, 1x1 Conv, ReduceSum: NPU-native ops), instead
of constant-index gathers whose folded Toeplitz weights grow with N^3.

All passes work on ONNX whose shapes are pinned (see surgery.fold.fold_fixed)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gates.verdict import Verdict, at_most

CHAIN_OPS = ("Pad", "Reshape", "Slice")


@dataclass(frozen=True)
class ShiftChain:
    """One skew chain: `kind` is "rel_to_abs" ([.., N, 2N-1] relative logits -> [.., N, N] absolute bias)
    or "abs_to_rel" ([.., N, N] attention weights -> [.., N, 2N-1] relative weights)."""

    kind: str
    source: str  # tensor entering the first Pad
    result: str  # tensor leaving the last Slice
    nodes: tuple[int, ...]  # indices into graph.node, in order


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _consumers(model: onnx.ModelProto) -> dict[str, list[int]]:
    users: dict[str, list[int]] = {}
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            users.setdefault(name, []).append(index)
    return users


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    for name, array in _constants(model).items():
        shapes[name] = array.shape
    return shapes


def find_shift_chains(model: onnx.ModelProto) -> list[ShiftChain]:
    """Every Pad -> (Reshape | Pad)* -> Slice run with at least two Pads and one Reshape whose ends have the
    relative/absolute shapes [.., N, 2N-1] and [.., N, N] (either way round)."""
    nodes = model.graph.node
    users = _consumers(model)
    shapes = _shapes(model)
    producer = {out: i for i, node in enumerate(nodes) for out in node.output}
    chains = []
    for start, node in enumerate(nodes):
        before = producer.get(node.input[0])
        if node.op_type != "Pad" or (before is not None and nodes[before].op_type in ("Pad", "Reshape")):
            continue
        path, current = [start], node
        while current.op_type != "Slice":
            following = users.get(current.output[0], [])
            if len(following) != 1 or nodes[following[0]].op_type not in CHAIN_OPS:
                break
            path.append(following[0])
            current = nodes[following[0]]
        ops = [nodes[i].op_type for i in path]
        if current.op_type != "Slice" or ops.count("Pad") < 2 or "Reshape" not in ops:
            continue
        source, result = node.input[0], current.output[0]
        kind = _chain_kind(shapes.get(source), shapes.get(result))
        if kind:
            chains.append(ShiftChain(kind, source, result, tuple(path)))
    return chains


def _chain_kind(source: tuple | None, result: tuple | None) -> str | None:
    if not source or not result or len(source) < 2 or source[:-1] != result[:-1]:
        return None
    n = source[-2]
    if source[-1] == 2 * n - 1 and result[-1] == n:
        return "rel_to_abs"
    if source[-1] == n and result[-1] == 2 * n - 1:
        return "abs_to_rel"
    return None


def shift_chain_verdict(model: onnx.ModelProto) -> Verdict:
    """Gate: the graph an engine is compiled from must hold no relative-shift chain (the NPU computes them wrong)."""
    chains = find_shift_chains(model)
    names = ", ".join(model.graph.node[c.nodes[0]].name or c.source for c in chains[:4])
    return at_most("relative-shift chains", len(chains), 0, "chains",
                   f"Pad+Reshape+Slice skews left in: {names}" if chains else "")


def skew_reference(x: np.ndarray, kind: str) -> np.ndarray:
    """What a shift chain computes, in numpy: rel_to_abs out[i, j] = x[i, j - i + N - 1];
    abs_to_rel out[i, r] = x[i, i + r - N + 1] (zero where that column does not exist)."""
    n = x.shape[-2]
    i = np.arange(n)[:, None]
    if kind == "rel_to_abs":
        return np.take_along_axis(x, np.broadcast_to(np.arange(n)[None, :] - i + n - 1, x.shape[:-1] + (n,)), -1)
    column = i + np.arange(2 * n - 1)[None, :] - n + 1
    valid = (column >= 0) & (column < n)
    index = np.broadcast_to(np.clip(column, 0, n - 1), x.shape[:-1] + (2 * n - 1,))
    return np.where(valid, np.take_along_axis(x, index, -1), 0.0)


def _check_chain(model: onnx.ModelProto, chain: ShiftChain, shapes: dict) -> None:
    """Run the chain alone on random data and compare with `skew_reference`: only a chain that really is the
    relative shift may be replaced by the banded form."""
    import onnxruntime as ort

    nodes = [model.graph.node[i] for i in chain.nodes]
    constants = _constants(model)
    needed = {name for node in nodes for name in node.input if name in constants}
    graph = helper.make_graph(
        nodes, "shift_chain",
        [helper.make_tensor_value_info(chain.source, onnx.TensorProto.FLOAT, shapes[chain.source])],
        [helper.make_tensor_value_info(chain.result, onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(constants[name], name) for name in sorted(needed)],
    )
    probe = helper.make_model(graph, opset_imports=model.opset_import)
    probe.ir_version = model.ir_version
    x = np.random.default_rng(0).standard_normal(shapes[chain.source]).astype(np.float32)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {chain.source: x})[0]
    if not np.array_equal(got, skew_reference(x, chain.kind).astype(np.float32)):
        raise ValueError(f"chain {chain.source} -> {chain.result} is not the relative shift it looks like")


def _window(relative: np.ndarray, n: int) -> int:
    """Half-width of the band of non-zero relative positions around the centre index n-1 (axis 0)."""
    rows = np.nonzero(np.any(relative.reshape(relative.shape[0], -1) != 0, axis=1))[0]
    return int(np.max(np.abs(rows - (n - 1)))) if rows.size else 0


def band_constant(heads: int, n: int, window: int) -> np.ndarray:
    """[1, heads*(2w+1), N, N] 0/1: channel h*(2w+1)+k is the diagonal j - i = k - w (tiled per head)."""
    offsets = np.arange(-window, window + 1)
    diagonal = np.arange(n)[None, None, :] - np.arange(n)[None, :, None]
    bands = (diagonal == offsets[:, None, None]).astype(np.float32)
    return np.tile(bands, (heads, 1, 1))[None]


def banded_relative_attention(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace every relative-shift chain (and the MatMul with the zero-padded relative embedding next to it)
    by the banded form: only 2w+1 diagonals are non-zero, so the NPU gets MatMul/Mul/Conv/ReduceSum on one
    shared band constant instead of a skew it computes wrong."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    chains = find_shift_chains(out)
    if not chains:
        return out
    shapes = _shapes(out)
    constants = _constants(out)
    users = _consumers(out)
    producer = {o: i for i, node in enumerate(graph.node) for o in node.output}
    removed: set[int] = set()
    inserted: dict[int, list[onnx.NodeProto]] = {}
    shared: dict[str, np.ndarray] = {}

    for number, chain in enumerate(chains):
        _check_chain(out, chain, shapes)
        tag = f"relshift{number}"
        removed.update(chain.nodes)
        if chain.kind == "rel_to_abs":
            matmul_index = producer[chain.source]
            matmul = graph.node[matmul_index]
            relative = constants.get(matmul.input[1])
            if matmul.op_type != "MatMul" or relative is None or users[chain.source] != [chain.nodes[0]]:
                raise ValueError(f"relative logits {chain.source} do not come from a MatMul with a constant embedding")
            queries = matmul.input[0]
            batch, heads, n, _ = shapes[queries]
            table = relative.reshape(relative.shape[-2], relative.shape[-1]).T  # [2N-1, d]
            window = _window(table, n)
            names = _shared_band(shared, heads, n, window)
            embedding = f"{tag}/emb_k"
            shared[embedding] = np.ascontiguousarray(table[n - 1 - window:n + window].T)[None, None]  # [1,1,d,K]
            k = 2 * window + 1
            removed.add(matmul_index)
            inserted[matmul_index] = [
                helper.make_node("MatMul", [queries, embedding], [f"{tag}/logits"], name=f"{tag}/MatMul"),
                helper.make_node("Transpose", [f"{tag}/logits"], [f"{tag}/logits_t"], perm=[0, 1, 3, 2],
                                 name=f"{tag}/Transpose"),
                helper.make_node("Reshape", [f"{tag}/logits_t", _shape_const(shared, [batch, heads * k, n, 1])],
                                 [f"{tag}/columns"], name=f"{tag}/Reshape"),
                helper.make_node("Mul", [f"{tag}/columns", names["band"]], [f"{tag}/spread"], name=f"{tag}/Mul"),
                helper.make_node("Conv", [f"{tag}/spread", names["sum_bands"]], [chain.result],
                                 kernel_shape=[1, 1], name=f"{tag}/SumBands"),
            ]
        else:
            following = users.get(chain.result, [])
            matmul_index = following[0] if len(following) == 1 else -1
            matmul = graph.node[matmul_index] if matmul_index >= 0 else None
            relative = constants.get(matmul.input[1]) if matmul is not None else None
            if matmul is None or matmul.op_type != "MatMul" or relative is None:
                raise ValueError(f"relative weights {chain.result} do not feed a MatMul with a constant embedding")
            batch, heads, n, _ = shapes[chain.source]
            table = relative.reshape(relative.shape[-2], relative.shape[-1])  # [2N-1, d]
            window = _window(table, n)
            names = _shared_band(shared, heads, n, window)
            embedding = f"{tag}/emb_v"
            shared[embedding] = np.ascontiguousarray(table[n - 1 - window:n + window])[None, None]  # [1,1,K,d]
            k = 2 * window + 1
            removed.add(matmul_index)
            inserted[matmul_index] = [
                helper.make_node("Conv", [chain.source, names["repeat_heads"]], [f"{tag}/repeated"],
                                 kernel_shape=[1, 1], name=f"{tag}/RepeatHeads"),
                helper.make_node("Mul", [f"{tag}/repeated", names["band"]], [f"{tag}/banded"], name=f"{tag}/Mul"),
                helper.make_node("MatMul", [f"{tag}/banded", _ones_const(shared, n)], [f"{tag}/weights"],
                                 name=f"{tag}/SumRow"),
                helper.make_node("Reshape", [f"{tag}/weights", _shape_const(shared, [batch, heads, k, n])],
                                 [f"{tag}/weights_hkn"], name=f"{tag}/Reshape"),
                helper.make_node("Transpose", [f"{tag}/weights_hkn"], [f"{tag}/weights_hnk"], perm=[0, 1, 3, 2],
                                 name=f"{tag}/Transpose"),
                helper.make_node("MatMul", [f"{tag}/weights_hnk", embedding], [matmul.output[0]],
                                 name=f"{tag}/MatMul"),
            ]

    kept = []
    for index, node in enumerate(graph.node):
        kept.extend(inserted.get(index, []))
        if index not in removed:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in shared.items())
    return _drop_unused_initializers(out)


def _shared_band(shared: dict, heads: int, n: int, window: int) -> dict[str, str]:
    """Names of the band constant and the two 1x1 Conv weights for (heads, N, w), created once per graph."""
    k = 2 * window + 1
    names = {"band": f"relshift/band_h{heads}_k{k}_n{n}", "sum_bands": f"relshift/sum_bands_h{heads}_k{k}",
             "repeat_heads": f"relshift/repeat_heads_h{heads}_k{k}"}
    if names["band"] not in shared:
        shared[names["band"]] = band_constant(heads, n, window)
        block = np.kron(np.eye(heads, dtype=np.float32), np.ones((1, k), dtype=np.float32))  # [H, H*K]
        shared[names["sum_bands"]] = block[:, :, None, None]
        shared[names["repeat_heads"]] = np.ascontiguousarray(block.T)[:, :, None, None]
    return names


def _shape_const(shared: dict, shape: list[int]) -> str:
    name = "relshift/shape_" + "x".join(map(str, shape))
    shared.setdefault(name, np.array(shape, dtype=np.int64))
    return name


def _ones_const(shared: dict, n: int) -> str:
    name = f"relshift/ones_{n}x1"
    shared.setdefault(name, np.ones((1, 1, n, 1), dtype=np.float32))
    return name


def _drop_unused_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    live = [init for init in model.graph.initializer if init.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(live)
    return model


def arithmetic_masked_fill(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite `Where(Equal(mask, 0), fill, scores)` as `scores*mask + (1-mask)*fill` (exact for a 0/1 mask):
    the Equal/Where pair runs on the CPU, Mul/Add stay on the NPU."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    constants = _constants(out)
    producer = {o: node for node in graph.node for o in node.output}
    fills: dict[tuple[str, float], str] = {}
    kept, extra = [], {}
    for node in graph.node:
        equal = producer.get(node.input[0]) if node.op_type == "Where" else None
        fill = constants.get(node.input[1]) if equal is not None else None
        zero = constants.get(equal.input[1]) if equal is not None and equal.op_type == "Equal" else None
        if zero is None or fill is None or fill.size != 1 or zero.size != 1 or float(zero.ravel()[0]) != 0.0:
            kept.append(node)
            continue
        mask, value = equal.input[0], float(fill.ravel()[0])
        key = (mask, value)
        if key not in fills:
            tag = f"maskfill{len(fills)}"
            extra[f"{tag}/one"] = np.array(1.0, dtype=np.float32)
            extra[f"{tag}/fill"] = np.array(value, dtype=np.float32)
            kept.append(helper.make_node("Sub", [f"{tag}/one", mask], [f"{tag}/outside"], name=f"{tag}/Sub"))
            kept.append(helper.make_node("Mul", [f"{tag}/outside", f"{tag}/fill"], [f"{tag}/bias"], name=f"{tag}/Mul"))
            fills[key] = f"{tag}/bias"
        kept.append(helper.make_node("Mul", [node.input[2], mask], [node.output[0] + "/kept"], name=node.name + "/Keep"))
        kept.append(helper.make_node("Add", [node.output[0] + "/kept", fills[key]], [node.output[0]], name=node.name + "/Fill"))
    used = {name for node in kept for name in node.input} | {o.name for o in graph.output}
    kept = [n for n in kept if n.op_type != "Equal" or n.output[0] in used]
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in extra.items())
    return _drop_unused_initializers(out)
