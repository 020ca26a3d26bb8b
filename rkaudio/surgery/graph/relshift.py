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

from rkaudio.core.onnx_graph import GraphIndex, constant_values, drop_unused_initializers, live_nodes, static_shapes
from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.attention import divided_by_row_sum, exp_below_bound, values_and_ones, widened_depth

CHAIN_OPS = ("Pad", "Reshape", "Slice")
FORMS = ("native", "exp_ratio")
# The RK3566 form's DFT terms are [.., 4(2w+1)] wide, padded with zero columns to a multiple of this (w = 4: 36 -> 40,
# the width its 0-CPU-op probe was built at, toolkit 2.3.2).
DFT_COLUMN_MULTIPLE = 8
# An identity Clip (the bounds are past fp16's 65504, so no value changes) between a MatMul by a constant and the
# Mul by a row-varying constant after it: rknn's `_p_fuse_mul_into_gemm` folds such a Mul into the MatMul's weights,
# which is wrong when the Mul varies along the rows (toolkit 2.3.2: a crash where the shapes do not broadcast, a
# silent miscompile, simulator 16.9 dB, where they do).
FUSION_BARRIER = 60000.0


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
        if node.op_type != "Pad":
            continue
        before = producer.get(node.input[0])
        if before is not None and nodes[before].op_type in ("Pad", "Reshape"):
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


def banded_relative_attention(model: onnx.ModelProto, form: str = "native",
                              logit_bound: float | None = None) -> onnx.ModelProto:
    """Rewrite each relative-attention core (QK^T + skewed relative logits, masked_fill, Softmax, PV + skewed
    relative values) into a banded form with no skew chain (the NPU computes those wrong). `form` "native": laid out
    as [heads, query, 1, key], only 2w+1 diagonals of constants, and the layout the toolkit's MatMul emits natively,
    which keeps Softmax and the QK^T output on the NPU at N >= 384 (in [1, heads, N, N] both fall back to the CPU).
    "exp_ratio": the RK3566 form (`_exp_ratio_core`: rank 3, no Softmax, no Transpose; that compiler runs Softmax,
    Exp and rank-4 or leading-axis layouts on its CPU), its exp shifted by each row's max (`logit_bound` None) or by
    the constant `logit_bound`."""
    if form not in FORMS:
        raise ValueError(f"relative attention form {form!r}: one of {FORMS}")
    if form == "native" and logit_bound is not None:
        raise ValueError("relative attention: logit_bound belongs to the exp_ratio form")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    layers = _attention_layers(out)
    if not layers:
        return out
    shapes = static_shapes(out)
    shared: dict[str, np.ndarray] = {}
    inserted: dict[int, list[onnx.NodeProto]] = {}
    masks: dict = {}  # per mask (and fill): the tensors the forms build from it once
    for number, layer in enumerate(layers):
        batch, heads, n, depth = shapes[layer.queries]
        if batch != 1:
            raise ValueError(f"relative attention: batch {batch}; the banded form is written for batch 1")
        window = max(_window(layer.emb_k.T, n), _window(layer.emb_v, n))
        k = 2 * window + 1
        tag = f"relattn{number}"
        if form == "exp_ratio":
            inserted[layer.anchor] = _exp_ratio_core(layer, tag, (heads, n, depth), window, logit_bound,
                                                     GraphIndex(out), shapes, shared, masks)
            continue
        # One band constant per use (logits, weights), each shared by all layers: the toolkit lays the two uses
        # out differently, and a single tensor used both ways is cloned per layer (27 MB more at N=512). Named
        # without N: the band at N is the leading corner of the band at any longer N, so the widths of a ladder
        # stay one graph (rkaudio.surgery.graph.shape_generic).
        band_logits, band_weights = f"relattn/band_logits_k{k}", f"relattn/band_weights_k{k}"
        shared.setdefault(band_logits, band_constant(n, window))
        shared.setdefault(band_weights, band_constant(n, window))
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
    del graph.node[:]
    # dead now: the masked_fill's Equal (in the exp_ratio form, its mask too)
    graph.node.extend(live_nodes(kept, {o.name for o in graph.output}))
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in shared.items())
    return drop_unused_initializers(out)


def _exp_ratio_core(layer: _Layer, tag: str, dims: tuple[int, int, int], window: int, logit_bound: float | None,
                    index: GraphIndex, shapes: dict, shared: dict, masks: dict) -> list[onnx.NodeProto]:
    """One core in the RK3566 form, every tensor [heads, query, *] (rank 3, no Transpose): the relative terms as a DFT
    over the band's 2w+1 offsets (`_dft_constants`), the mask on the keys only (`_key_mask`), e = exp(logits -
    shift) as a Sigmoid ratio (`exp_below_bound`), then (e @ [V | 1 | 0..] + relative values) divided by the ones
    column's row sum (the relative values add 0 to it)."""
    heads, n, depth = dims
    dft = _dft_constants(n, window, shared)
    make, lowest, highest = helper.make_node, "relattn/fusion_barrier_low", "relattn/fusion_barrier_high"
    shared.setdefault(lowest, np.array(-FUSION_BARRIER, dtype=np.float32))
    shared.setdefault(highest, np.array(FUSION_BARRIER, dtype=np.float32))
    emb_k = layer.emb_k[:, n - 1 - window:n + window].astype(np.float64)  # [d, 2w+1]: column k is offset k - w
    emb_v = layer.emb_v[n - 1 - window:n + window].astype(np.float64)  # [2w+1, d]
    emb_v_and_zeros = np.concatenate([emb_v, np.zeros((len(emb_v), widened_depth(depth) - depth))], axis=-1)
    shared[f"{tag}/emb_k_spectrum"] = _dft_padded(emb_k @ dft.keys, 1)
    shared[f"{tag}/emb_v_spectrum"] = _dft_padded(dft.values @ emb_v_and_zeros, 0)
    queries, keys, values = f"{tag}/queries", f"{tag}/keys", f"{tag}/values"
    new = [
        make("Reshape", [layer.queries, _int_const(shared, [heads, n, depth])], [queries], name=f"{tag}/Queries"),
        make("Reshape", [layer.keys, _int_const(shared, [heads, depth, n])], [keys], name=f"{tag}/Keys"),
        make("Reshape", [layer.values, _int_const(shared, [heads, n, depth])], [values], name=f"{tag}/Values"),
        make("MatMul", [queries, keys], [f"{tag}/scores"], name=f"{tag}/QK"),
        make("MatMul", [queries, f"{tag}/emb_k_spectrum"], [f"{tag}/rel_spectrum"], name=f"{tag}/QRelK"),
        make("Clip", [f"{tag}/rel_spectrum", lowest, highest], [f"{tag}/rel_spectrum_kept"],
             name=f"{tag}/RelSpectrumBarrier"),
        make("Mul", [f"{tag}/rel_spectrum_kept", dft.bias_phase], [f"{tag}/rel_phased"], name=f"{tag}/RelPhase"),
        make("MatMul", [f"{tag}/rel_phased", dft.bias_basis], [f"{tag}/rel_periodic"], name=f"{tag}/RelInverse"),
        make("Clip", [f"{tag}/rel_periodic", lowest, highest], [f"{tag}/rel_periodic_kept"],
             name=f"{tag}/RelPeriodicBarrier"),
        make("Mul", [f"{tag}/rel_periodic_kept", dft.band], [f"{tag}/rel_bias"], name=f"{tag}/RelBias"),
        make("Add", [f"{tag}/scores", f"{tag}/rel_bias"], [f"{tag}/logits"], name=f"{tag}/AddRel"),
    ]
    key_mask, logits, weights = _key_mask(layer, index, shapes, shared, masks, new), f"{tag}/logits", f"{tag}/exp"
    if key_mask:
        # masked keys' logits 0 rather than the fill for the row max, their weights 0 after the exp: the tree's
        # max(a, b) = b + Relu(a - b) rounds a - b at the fill's magnitude (-1e4: 1e-3 in fp32, joe w128 at 17 of
        # 128 tokens 90 dB against the raw slice, measured while the exp clamped a shift under the row's max).
        # A padded row's shift is then at least 0: its weights leave fp16's normal range only where all its kept
        # logits sit EXP_WINDOW (9.7) under 0 (joe, widths 128-512: the lowest row max is -0.41).
        new.append(make("Mul", [logits, key_mask], [f"{tag}/kept_logits"], name=f"{tag}/KeptLogits"))
        logits, weights = f"{tag}/kept_logits", f"{tag}/kept_exp"
    new += exp_below_bound(logits, logit_bound, tag, shared, keys=n)
    if key_mask:
        new.append(make("Mul", [f"{tag}/exp", key_mask], [weights], name=f"{tag}/KeptExp"))
    widened = values_and_ones(values, tag, index, {**shapes, values: (heads, n, depth)}, {}, shared, new)
    new += [
        make("MatMul", [weights, widened], [f"{tag}/weighted_and_sum"], name=f"{tag}/WeightedAndSum"),
        make("Mul", [weights, dft.band], [f"{tag}/exp_banded"], name=f"{tag}/ExpBanded"),
        make("MatMul", [f"{tag}/exp_banded", dft.values_basis], [f"{tag}/rel_weights_spectrum"],
             name=f"{tag}/RelWeightsForward"),
        make("Clip", [f"{tag}/rel_weights_spectrum", lowest, highest], [f"{tag}/rel_weights_spectrum_kept"],
             name=f"{tag}/RelWeightsBarrier"),
        make("Mul", [f"{tag}/rel_weights_spectrum_kept", dft.values_phase], [f"{tag}/rel_weights_phased"],
             name=f"{tag}/RelWeightsPhase"),
        make("MatMul", [f"{tag}/rel_weights_phased", f"{tag}/emb_v_spectrum"], [f"{tag}/rel_values"],
             name=f"{tag}/RelV"),
        make("Add", [f"{tag}/weighted_and_sum", f"{tag}/rel_values"], [f"{tag}/weighted"], name=f"{tag}/AddRelV"),
    ]
    new += divided_by_row_sum(f"{tag}/weighted", depth, 3, f"{tag}/attended", tag, shared)
    new.append(make("Reshape", [f"{tag}/attended", _int_const(shared, [1, heads, n, depth])], [layer.output],
                    name=f"{tag}/Attended4"))
    return new


@dataclass(frozen=True)
class _Dft:
    """The shared constants' names of the RK3566 form's DFT terms, and the offset-side matrices of each layer's."""

    bias_phase: str  # [1, N, P]: [c_i | s_i | c_i | -s_i]
    bias_basis: str  # [P, N]: [c_j; c_j; -s_j; -s_j] / T
    values_basis: str  # [N, P]: [c_j | c_j | s_j | s_j]
    values_phase: str  # [1, N, P]: [c_i | s_i | c_i | s_i]
    band: str  # [N, N]: 1 where |j - i| <= w
    keys: np.ndarray  # [2w+1, 4T]: emb_k @ this is the relative keys' spectrum
    values: np.ndarray  # [4T, 2w+1]: this @ emb_v is the relative values' inverse transform


def _dft_constants(n: int, window: int, shared: dict) -> _Dft:
    """The band products of the RK3566 form as a length-T DFT, T = 2w+1 (the offsets j - i - (k - w) of the band
    are distinct mod T, so [j - i = k - w] = (1/T) sum_m cos(theta_m (j - i + w - k)), theta_m = 2 pi m / T, exact):
    rel_bias = band * (((q @ emb_k @ [ca | sa | sa | ca]) * [c_i | s_i | c_i | -s_i]) @ [c_j; c_j; -s_j; -s_j] / T)
    rel_values = (((e * band) @ [c_j | c_j | s_j | s_j]) * [c_i | s_i | c_i | s_i]) @ [ca; sa; -sa; ca]^T / T @ emb_v
    with c_i = cos(theta_m i), s_i = sin(theta_m i), ca/sa = cos/sin(theta_m (w - k)): MatMuls and elementwise Muls
    at [heads, query, *] where the band products otherwise need the query rows leading (CPU Transposes on the
    RK3566). The position-side constants go into `shared` once (named without N: each is the leading corner of its
    value at any longer N), 4T columns padded to DFT_COLUMN_MULTIPLE."""
    period = 2 * window + 1
    theta = 2 * np.pi * np.arange(period) / period
    cos_i, sin_i = np.cos(np.outer(np.arange(n), theta)), np.sin(np.outer(np.arange(n), theta))  # [N, T]
    offsets = window - np.arange(period)  # w - k
    cos_a, sin_a = np.cos(np.outer(offsets, theta)), np.sin(np.outer(offsets, theta))  # [2w+1, T]
    names = _Dft(*(f"relattn/dft_k{period}/{part}" for part in
                   ("bias_phase", "bias_basis", "values_basis", "values_phase", "band")),
                 keys=np.concatenate([cos_a, sin_a, sin_a, cos_a], axis=1),
                 values=np.concatenate([cos_a.T, sin_a.T, -sin_a.T, cos_a.T], axis=0) / period)
    shared.setdefault(names.bias_phase, _dft_padded(np.concatenate([cos_i, sin_i, cos_i, -sin_i], axis=1), 1)[None])
    shared.setdefault(names.bias_basis, _dft_padded(np.concatenate([cos_i.T, cos_i.T, -sin_i.T, -sin_i.T]) / period, 0))
    shared.setdefault(names.values_basis, _dft_padded(np.concatenate([cos_i, cos_i, sin_i, sin_i], axis=1), 1))
    shared.setdefault(names.values_phase, _dft_padded(np.concatenate([cos_i, sin_i, cos_i, sin_i], axis=1), 1)[None])
    shared.setdefault(names.band, band_constant(n, window)[0].sum(axis=1))
    return names


def _dft_padded(values: np.ndarray, axis: int) -> np.ndarray:
    """float32 `values` with zeros appended along `axis` (its 4T DFT entries) up to a multiple of
    DFT_COLUMN_MULTIPLE."""
    pad = [(0, 0)] * values.ndim
    pad[axis] = (0, -values.shape[axis] % DFT_COLUMN_MULTIPLE)
    return np.ascontiguousarray(np.pad(values, pad).astype(np.float32))


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


def _key_mask(layer: _Layer, index: GraphIndex, shapes: dict, shared: dict, masks: dict, new: list) -> str | None:
    """Name of the [1, 1, N] 0/1 key mask m of the layer's masked_fill(mask == 0, fill) (None without one), for a mask
    built as the outer product m_i * m_j (VITS: x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)); made once per mask, its
    nodes appended to `new`. The exp_ratio form masks keys only: a padded query's row attends the kept keys instead
    of all keys alike, and VITS never reads those rows (it multiplies x by x_mask before every conv and at the
    encoder's end); on the RK3566 the [N, N] mask costs a CPU Transpose, the [1, 1, N] one none."""
    if layer.mask is None:
        return None
    if layer.mask not in masks:
        masks[layer.mask] = f"relattn/key_mask{len(masks)}"
        new.append(helper.make_node("Reshape", [_key_factor(layer.mask, index, shapes),
                                                _int_const(shared, [1, 1, shapes[layer.mask][-1]])],
                                    [masks[layer.mask]], name=f"relattn/KeyMask{len(masks) - 1}"))
    return masks[layer.mask]


def _key_factor(mask: str, index: GraphIndex, shapes: dict) -> str:
    """m of a mask built as Mul(Unsqueeze/Reshape(m) to [.., 1, N], Unsqueeze/Reshape(m) to [.., N, 1]), else
    ValueError (the exp_ratio form masks keys only, so it only takes such a mask)."""
    outer, n = index.producer.get(mask), shapes[mask][-1]
    factors = [index.producer.get(name) for name in outer.input] if outer is not None and outer.op_type == "Mul" else []
    layouts = sorted(shapes.get(name, ())[-2:] for name in (outer.input if factors else []))
    unsqueezed = all(f is not None and f.op_type in ("Unsqueeze", "Reshape") and f.input[0] == factors[0].input[0]
                     for f in factors)
    if len(factors) != 2 or layouts != [(1, n), (n, 1)] or not unsqueezed:
        raise ValueError(f"relative attention: the mask {mask} is not m_i * m_j of one key mask m (the exp_ratio form "
                         "masks keys only)")
    return factors[0].input[0]


def _int_const(shared: dict, values: list[int]) -> str:
    """Name of the shared int64 constant holding `values` (one tensor per distinct shape list)."""
    name = "relattn/i64_" + "_".join(map(str, values))
    shared.setdefault(name, np.array(values, dtype=np.int64))
    return name
