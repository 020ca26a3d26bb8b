"""Relative-position attention (VITS/Piper): find the relative-shift chains and rewrite each attention core
into a banded form.

Why: with the token axis pinned, every relative-attention layer keeps two `Pad + Reshape + Pad + Reshape +
Slice` chains that skew [N, 2N-1] relative slabs by one step per query row. The NPU computes those chains as
garbage (uninitialised memory, NaN, +-65504) while the simulator looks fine, so they must leave the graph.
Only the 2w+1 diagonals inside the attention window are non-zero, so both chains become products with a 0/1
band constant of (2w+1) x N^2 shared by all layers (MatMul, Mul, ReduceSum: NPU-native ops), instead of
constant-index gathers whose folded Toeplitz weights grow with N^3.

All passes work on ONNX whose shapes are pinned (see rkaudio.surgery.graph.fold.fold_fixed)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.core.onnx_graph import GraphIndex, constant_values, drop_unused_initializers, static_shapes
from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.attention import divided_by_row_sum, exp_below_bound, values_and_ones, widened_depth

CHAIN_OPS = ("Pad", "Reshape", "Slice")


@dataclass(frozen=True)
class ShiftChain:
    """One skew chain: `kind` is "rel_to_abs" ([.., N, 2N-1] relative logits -> [.., N, N] absolute bias)
    or "abs_to_rel" ([.., N, N] attention weights -> [.., N, 2N-1] relative weights)."""

    kind: str
    source: str  # tensor entering the first Pad
    result: str  # tensor leaving the last Slice
    nodes: tuple[int, ...]  # indices into graph.node, in order


def find_shift_chains(model: onnx.ModelProto) -> list[ShiftChain]:
    """Every Pad -> (Reshape | Pad)* -> Slice run with at least two Pads and one Reshape whose ends have the
    relative/absolute shapes [.., N, 2N-1] and [.., N, N] (either way round)."""
    index = GraphIndex(model)
    nodes, users, producer = index.nodes, index.consumer_positions, index.producer_position
    shapes = static_shapes(model)
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
    """"rel_to_abs", "abs_to_rel" or None, from the shapes at the chain's two ends."""
    if not source or not result or len(source) < 2 or source[:-1] != result[:-1]:
        return None
    n = source[-2]
    if source[-1] == 2 * n - 1 and result[-1] == n:
        return "rel_to_abs"
    if source[-1] == n and result[-1] == 2 * n - 1:
        return "abs_to_rel"
    return None


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
    nodes = [model.graph.node[i] for i in chain.nodes]
    constants = constant_values(model.graph)
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
    got = OnnxBackend(probe).run({chain.source: x})[chain.result]
    if not np.array_equal(got, skew_reference(x, chain.kind).astype(np.float32)):
        raise ValueError(f"chain {chain.source} -> {chain.result} is not the relative shift it looks like")


def _window(relative: np.ndarray, n: int) -> int:
    """Half-width of the band of non-zero relative positions around the centre index n-1 (axis 0)."""
    rows = np.nonzero(np.any(relative.reshape(relative.shape[0], -1) != 0, axis=1))[0]
    return int(np.max(np.abs(rows - (n - 1)))) if rows.size else 0


def band_constant(n: int, window: int) -> np.ndarray:
    """[1, N, 2w+1, N] 0/1 in the query-row layout: [0, i, k, j] = 1 where j - i = k - w."""
    offsets = np.arange(-window, window + 1)
    diagonal = np.arange(n)[None, None, :] - np.arange(n)[:, None, None]  # [i, 1, j]: j - i
    return (diagonal == offsets[None, :, None]).astype(np.float32)[None]


@dataclass
class _Layer:
    """One relative-attention core: the nodes it replaces and the tensors the banded form reads."""

    queries: str  # scaled queries [1, H, N, d]
    keys: str  # [1, H, d, N]
    values: str  # [1, H, N, d]
    emb_k: np.ndarray  # relative key embedding, padded [d, 2N-1]
    emb_v: np.ndarray  # relative value embedding, padded [2N-1, d]
    mask: str | None  # 0/1 attention mask [1, 1, N, N] of a masked_fill, if any
    fill: float
    output: str  # attention output [1, H, N, d]
    nodes: set[int]
    anchor: int  # the last replaced node: the banded form is inserted here


def _single(users: dict, name: str, nodes, op: str | None = None) -> int:
    """Position of the one node reading `name` (an `op` node if given); the core's wiring is checked as it is read."""
    found = users.get(name, [])
    if len(found) != 1 or (op and nodes[found[0]].op_type != op):
        raise ValueError(f"relative attention: {name} should feed exactly one {op or 'node'}")
    return found[0]


def _attention_layers(model: onnx.ModelProto) -> list[_Layer]:
    """Pair each rel_to_abs chain with the abs_to_rel chain behind its Softmax and collect the core around them."""
    index = GraphIndex(model)
    nodes, users, producer = index.nodes, index.consumer_positions, index.producer_position
    constants = constant_values(model.graph)
    chains = find_shift_chains(model)
    by_source = {c.source: c for c in chains if c.kind == "abs_to_rel"}
    layers, shapes = [], static_shapes(model) if chains else {}
    for chain in (c for c in chains if c.kind == "rel_to_abs"):
        logits = nodes[producer[chain.source]]
        if logits.op_type != "MatMul" or logits.input[1] not in constants:
            raise ValueError(f"relative logits {chain.source} do not come from a MatMul with a constant embedding")
        add = _single(users, chain.result, nodes, "Add")
        scores_name = [n for n in nodes[add].input if n != chain.result][0]
        scores = nodes[producer[scores_name]]
        if scores.op_type != "MatMul" or scores.input[0] != logits.input[0]:
            raise ValueError(f"relative attention: {scores_name} is not the query-key MatMul")
        replaced = {producer[chain.source], producer[scores_name], add, *chain.nodes}
        after, mask, fill = _single(users, nodes[add].output[0], nodes), None, 0.0
        if nodes[after].op_type == "Where":
            equal = nodes[producer[nodes[after].input[0]]]
            zero, value = constants.get(equal.input[1]), constants.get(nodes[after].input[1])
            if equal.op_type != "Equal" or zero is None or value is None or zero.size != 1 or float(zero) != 0:
                raise ValueError("relative attention: the masked_fill is not Where(Equal(mask, 0), fill, scores)")
            mask, fill = equal.input[0], float(value.ravel()[0])
            replaced.add(after)
            after = _single(users, nodes[after].output[0], nodes)
        softmax = nodes[after]
        if softmax.op_type != "Softmax":
            raise ValueError(f"relative attention: expected a Softmax after {nodes[add].output[0]}")
        replaced.add(after)
        weights = softmax.output[0]
        value_chain = by_source.get(weights)
        if value_chain is None or len(users[weights]) != 2:
            raise ValueError(f"relative attention: {weights} should feed one value MatMul and one shift chain")
        value_mm = [i for i in users[weights] if i != value_chain.nodes[0]][0]
        rel_mm = _single(users, value_chain.result, nodes, "MatMul")
        total = _single(users, nodes[rel_mm].output[0], nodes, "Add")
        if nodes[value_mm].op_type != "MatMul" or nodes[rel_mm].input[1] not in constants \
                or set(nodes[total].input) != {nodes[value_mm].output[0], nodes[rel_mm].output[0]}:
            raise ValueError(f"relative attention: {weights} does not end in MatMul(p, v) + MatMul(rel, emb_v)")
        replaced |= {value_mm, rel_mm, total, *value_chain.nodes}
        emb_k, emb_v = constants[logits.input[1]], constants[nodes[rel_mm].input[1]]
        layers.append(_Layer(
            queries=logits.input[0], keys=scores.input[1], values=nodes[value_mm].input[1],
            emb_k=emb_k.reshape(emb_k.shape[-2:]), emb_v=emb_v.reshape(emb_v.shape[-2:]),
            mask=mask, fill=fill, output=nodes[total].output[0], nodes=replaced, anchor=total))
        for removed in (chain, value_chain):
            _check_chain(model, removed, shapes)
    return layers


def banded_relative_attention(model: onnx.ModelProto, logit_bound: float | None = None) -> onnx.ModelProto:
    """Rewrite each relative-attention core (QK^T + skewed relative logits, masked_fill, Softmax, PV + skewed
    relative values) into the banded form, laid out as [heads, query, 1, key]: no skew chain (the NPU computes
    those wrong), only 2w+1 diagonals of constants, and the layout the toolkit's MatMul emits natively, which
    keeps Softmax and the QK^T output on the NPU at N >= 384 (in [1, heads, N, N] both fall back to the CPU).
    With `logit_bound`, the RK3566 form instead (`_exp_ratio_core`): the core's tensors at rank <= 3, the Softmax as an
    exp ratio normalised after both value paths (that compiler runs Softmax and rank-4 attention on its CPU)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    layers = _attention_layers(out)
    if not layers:
        return out
    shapes = static_shapes(out)
    shared: dict[str, np.ndarray] = {}
    inserted: dict[int, list[onnx.NodeProto]] = {}
    masks: dict[tuple[str, float], tuple[str, str]] = {}
    for number, layer in enumerate(layers):
        batch, heads, n, depth = shapes[layer.queries]
        if batch != 1:
            raise ValueError(f"relative attention: batch {batch}; the banded form is written for batch 1")
        window = max(_window(layer.emb_k.T, n), _window(layer.emb_v, n))
        k = 2 * window + 1
        # One band constant per use (logits, weights), each shared by all layers: the toolkit lays the two uses
        # out differently, and a single tensor used both ways is cloned per layer (27 MB more at N=512). Named
        # without N: the band at N is the leading corner of the band at any longer N, so the widths of a ladder
        # stay one graph (rkaudio.surgery.graph.shape_generic).
        band_logits, band_weights = f"relattn/band_logits_k{k}", f"relattn/band_weights_k{k}"
        shared.setdefault(band_logits, band_constant(n, window))
        shared.setdefault(band_weights, band_constant(n, window))
        tag = f"relattn{number}"
        if logit_bound is not None:
            inserted[layer.anchor] = _exp_ratio_core(layer, tag, (heads, n, depth), window, logit_bound,
                                                     GraphIndex(out), shapes, shared, masks)
            continue
        shared[f"{tag}/emb_k"] = np.ascontiguousarray(layer.emb_k[:, n - 1 - window:n + window])[None, None]
        shared[f"{tag}/emb_v"] = np.ascontiguousarray(layer.emb_v[n - 1 - window:n + window])[None, None]
        make = helper.make_node
        rows = _int_const(shared, [heads, n, 1, n])
        new = [
            make("MatMul", [layer.queries, layer.keys], [f"{tag}/scores4"], name=f"{tag}/QK"),
            make("Reshape", [f"{tag}/scores4", rows], [f"{tag}/scores"], name=f"{tag}/ScoresRows"),
            make("MatMul", [layer.queries, f"{tag}/emb_k"], [f"{tag}/rel_logits"], name=f"{tag}/QRelK"),
            make("Reshape", [f"{tag}/rel_logits", _int_const(shared, [heads, n, k, 1])], [f"{tag}/rel_cols"],
                 name=f"{tag}/RelCols"),
            make("Mul", [f"{tag}/rel_cols", band_logits], [f"{tag}/rel_spread"], name=f"{tag}/RelSpread"),
            make("ReduceSum", [f"{tag}/rel_spread", _int_const(shared, [2])], [f"{tag}/rel_bias"], keepdims=1,
                 name=f"{tag}/RelBias"),
            make("Add", [f"{tag}/scores", f"{tag}/rel_bias"], [f"{tag}/logits"], name=f"{tag}/AddRel"),
        ]
        logits = _masked(f"{tag}/logits", layer, tag, [1, n, 1, n], shared, masks, new)
        new += [
            make("Softmax", [logits], [f"{tag}/weights"], axis=3, name=f"{tag}/Softmax"),
            make("Reshape", [f"{tag}/weights", _int_const(shared, [1, heads, n, n])], [f"{tag}/weights4"],
                 name=f"{tag}/Weights4"),
            make("MatMul", [f"{tag}/weights4", layer.values], [f"{tag}/attended"], name=f"{tag}/PV"),
            make("Mul", [f"{tag}/weights", band_weights], [f"{tag}/weights_banded"], name=f"{tag}/WeightsBanded"),
            make("ReduceSum", [f"{tag}/weights_banded", _int_const(shared, [3])], [f"{tag}/rel_weights"],
                 keepdims=1, name=f"{tag}/RelWeights"),
            make("Reshape", [f"{tag}/rel_weights", _int_const(shared, [1, heads, n, k])], [f"{tag}/rel_weights4"],
                 name=f"{tag}/RelWeights4"),
            make("MatMul", [f"{tag}/rel_weights4", f"{tag}/emb_v"], [f"{tag}/rel_values"], name=f"{tag}/RelV"),
            make("Add", [f"{tag}/attended", f"{tag}/rel_values"], [layer.output], name=f"{tag}/AddRelV"),
        ]
        inserted[layer.anchor] = new
    removed = set().union(*(layer.nodes for layer in layers))
    kept = []
    for index, node in enumerate(graph.node):
        kept.extend(inserted.get(index, []))
        if index not in removed:
            kept.append(node)
    used = {name for node in kept for name in node.input} | {o.name for o in graph.output}
    kept = [node for node in kept if node.op_type != "Equal" or node.output[0] in used]  # masked_fill leftovers
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in shared.items())
    return drop_unused_initializers(out)


def _exp_ratio_core(layer: _Layer, tag: str, dims: tuple[int, int, int], window: int, logit_bound: float,
                    index: GraphIndex, shapes: dict, shared: dict, masks: dict) -> list[onnx.NodeProto]:
    """One core in the RK3566 form, its tensors at rank <= 3: [heads, query, key], the band products as MatMuls
    batched over query rows ([query, heads, *] @ [query, *, *]); e = exp(min(s - bound, 0)) as a Sigmoid ratio, then
    (e @ [V | 1 | 0..] + (e . band) @ [emb_v | 0..]) divided by the ones column's row sum (the relative values add 0
    to it): no Softmax and no max, exact up to fp16 while every logit is at most the bound."""
    heads, n, depth = dims
    k = 2 * window + 1
    make = helper.make_node
    # [query i, offset, key j] and [query i, key j, offset]; named without N: the band at N is the leading corner of
    # the band at any longer N
    band_rows, band_columns = f"relattn/band_rows_k{k}", f"relattn/band_columns_k{k}"
    band = band_constant(n, window)[0]
    shared.setdefault(band_rows, band)
    shared.setdefault(band_columns, np.ascontiguousarray(band.transpose(0, 2, 1)))
    shared[f"{tag}/emb_k"] = np.ascontiguousarray(layer.emb_k[:, n - 1 - window:n + window])
    emb_v, width = layer.emb_v[n - 1 - window:n + window], widened_depth(depth)
    shared[f"{tag}/emb_v_and_zeros"] = np.concatenate([emb_v, np.zeros((k, width - depth), np.float32)], axis=-1)
    queries, keys, values = f"{tag}/queries", f"{tag}/keys", f"{tag}/values"
    swap = [1, 0, 2]  # [heads, query, *] <-> [query, heads, *]
    new = [
        make("Reshape", [layer.queries, _int_const(shared, [heads, n, depth])], [queries], name=f"{tag}/Queries"),
        make("Reshape", [layer.keys, _int_const(shared, [heads, depth, n])], [keys], name=f"{tag}/Keys"),
        make("Reshape", [layer.values, _int_const(shared, [heads, n, depth])], [values], name=f"{tag}/Values"),
        make("MatMul", [queries, keys], [f"{tag}/scores"], name=f"{tag}/QK"),
        make("MatMul", [queries, f"{tag}/emb_k"], [f"{tag}/rel_logits"], name=f"{tag}/QRelK"),
        make("Transpose", [f"{tag}/rel_logits"], [f"{tag}/rel_logits_rows"], perm=swap, name=f"{tag}/RelLogitsRows"),
        make("MatMul", [f"{tag}/rel_logits_rows", band_rows], [f"{tag}/rel_bias_rows"], name=f"{tag}/RelBiasRows"),
        make("Transpose", [f"{tag}/rel_bias_rows"], [f"{tag}/rel_bias"], perm=swap, name=f"{tag}/RelBias"),
        make("Add", [f"{tag}/scores", f"{tag}/rel_bias"], [f"{tag}/logits"], name=f"{tag}/AddRel"),
    ]
    logits = _masked(f"{tag}/logits", layer, tag, [1, n, n], shared, masks, new)
    new += exp_below_bound(logits, logit_bound, tag, shared)
    widened = values_and_ones(values, tag, index, {**shapes, values: (heads, n, depth)}, {}, shared, new)
    new += [
        make("MatMul", [f"{tag}/exp", widened], [f"{tag}/weighted_and_sum"], name=f"{tag}/WeightedAndSum"),
        make("Transpose", [f"{tag}/exp"], [f"{tag}/exp_rows"], perm=swap, name=f"{tag}/ExpRows"),
        make("MatMul", [f"{tag}/exp_rows", band_columns], [f"{tag}/rel_weights_rows"], name=f"{tag}/RelWeightsRows"),
        make("Transpose", [f"{tag}/rel_weights_rows"], [f"{tag}/rel_weights"], perm=swap, name=f"{tag}/RelWeights"),
        make("MatMul", [f"{tag}/rel_weights", f"{tag}/emb_v_and_zeros"], [f"{tag}/rel_values"], name=f"{tag}/RelV"),
        make("Add", [f"{tag}/weighted_and_sum", f"{tag}/rel_values"], [f"{tag}/weighted"], name=f"{tag}/AddRelV"),
    ]
    new += divided_by_row_sum(f"{tag}/weighted", depth, 3, f"{tag}/attended", tag, shared)
    new.append(make("Reshape", [f"{tag}/attended", _int_const(shared, [1, heads, n, depth])], [layer.output],
                    name=f"{tag}/Attended4"))
    return new


def _masked(logits: str, layer: _Layer, tag: str, rows_shape: list[int], shared: dict, masks: dict,
            new: list) -> str:
    """The logits after the layer's masked_fill(mask == 0, fill), as logits*mask + (1-mask)*fill: exact for a 0/1
    mask, no Equal/Where (those run on the CPU). The mask, reshaped to `rows_shape`, and its fill bias are built once
    per (mask, fill) and shared by the layers (`masks`); nodes are appended to `new`."""
    if layer.mask is None:
        return logits
    make, key = helper.make_node, (layer.mask, layer.fill)
    if key not in masks:
        mtag = f"relattn/mask{len(masks)}"
        shared[f"{mtag}/one"] = np.array(1.0, dtype=np.float32)
        shared[f"{mtag}/fill"] = np.array(layer.fill, dtype=np.float32)
        new += [
            make("Reshape", [layer.mask, _int_const(shared, rows_shape)], [f"{mtag}/rows"], name=f"{mtag}/Rows"),
            make("Sub", [f"{mtag}/one", f"{mtag}/rows"], [f"{mtag}/outside"], name=f"{mtag}/Outside"),
            make("Mul", [f"{mtag}/outside", f"{mtag}/fill"], [f"{mtag}/bias"], name=f"{mtag}/Bias"),
        ]
        masks[key] = (f"{mtag}/rows", f"{mtag}/bias")
    rows_mask, fill_bias = masks[key]
    new += [make("Mul", [logits, rows_mask], [f"{tag}/kept"], name=f"{tag}/Keep"),
            make("Add", [f"{tag}/kept", fill_bias], [f"{tag}/masked"], name=f"{tag}/Fill")]
    return f"{tag}/masked"


def _int_const(shared: dict, values: list[int]) -> str:
    """Name of the shared int64 constant holding `values` (one tensor per distinct shape list)."""
    name = "relattn/i64_" + "_".join(map(str, values))
    shared.setdefault(name, np.array(values, dtype=np.int64))
    return name
