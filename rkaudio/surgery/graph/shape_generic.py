"""One shape-generic graph from fixed-shape exports of the same model at several shape sets (a ladder's rungs).

Why: rknn-toolkit2's `config(dynamic_input=[...])` compiles one engine for several input shape sets and stores the
weights once, but it needs one ONNX that accepts every listed shape. The families export fixed shapes (every
sizing constant folded, `rkaudio.surgery.graph.fold`); the rungs of a ladder are then one graph that differs only in the
constants that spell a length. This pass takes those graphs, checks they are one graph (same nodes, same
weights), and writes each differing constant as a function of the input dims:
- a Reshape target whose one differing entry becomes -1 (the only unknown, so no shape arithmetic is needed);
- a Slice start or end a fixed distance from its axis end becomes that negative index (no arithmetic either);
- any other integer constant: each differing entry as `a * dim + b` of an input dim that varies with it, read
  with Shape -> Gather (the toolkit folds these per shape set, as it builds one graph per set);
- a table whose every set is the leading corner of the largest set's (RoPE rows, a causal mask, a ones column):
  the largest table, sliced to the set's sizes.
Anything else that differs (a band table whose values move with the width) is refused: it has to be an input.
Small constants (shape vectors, axes, scalars) are given one copy per reader first, so an exporter that shared
one constant between readers at one shape and not at another still yields one graph."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.core.onnx_graph import constant_values, static_shapes


class NotOneGraph(ValueError):
    """The fixed-shape graphs are not one graph at several shapes."""


@dataclass(frozen=True)
class Dim:
    """One varying input dim: where to read it and its value in each shape set."""

    input: str
    axis: int
    values: tuple[int, ...]
    symbol: str


def _input_dims(graph: onnx.GraphProto) -> dict[str, list[int]]:
    return {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}


def _output_dims(graph: onnx.GraphProto) -> dict[str, list[int]]:
    return {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output}


def varying_dims(models: list[onnx.ModelProto]) -> list[Dim]:
    """Every input dim that differs between the shape sets, named by its value sequence (dims that vary
    together share one symbol: `s0`, `s1`, ...)."""
    per_model = [_input_dims(m.graph) for m in models]
    first = per_model[0]
    for dims in per_model[1:]:
        if {k: len(v) for k, v in dims.items()} != {k: len(v) for k, v in first.items()}:
            raise NotOneGraph(f"the inputs differ in names or ranks: {first} vs {dims}")
    symbols: dict[tuple[int, ...], str] = {}
    found = []
    for name, dims in first.items():
        for axis in range(len(dims)):
            values = tuple(d[name][axis] for d in per_model)
            if len(set(values)) > 1:
                symbol = symbols.setdefault(values, f"s{len(symbols)}")
                found.append(Dim(name, axis, values, symbol))
    if not found:
        raise NotOneGraph("every input has the same shape in every set: there is nothing to make dynamic")
    return found


SMALL_CONSTANT = 64  # elements of an integer constant (a shape vector, axes); floats only as scalars


def own_small_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` where every reader of a small constant (an integer vector, a scalar) has its own copy,
    named after the reader's first output and the input position: exporters share such constants by value, so which
    readers share one differs with the shapes. Weights and tables stay shared."""
    from rkaudio.core.onnx_graph import constant_values

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    values = {name: value for name, value in constant_values(graph).items()
              if value.size == 1 or value.dtype.kind in "iu" and value.size <= SMALL_CONSTANT}
    copies = []
    for node in graph.node:
        if node.op_type == "Constant":
            continue
        for position, name in enumerate(node.input):
            if name in values:
                node.input[position] = f"{node.output[0]}/in{position}"
                copies.append(numpy_helper.from_array(values[name], node.input[position]))
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept + copies)
    nodes = [n for n in graph.node if n.op_type != "Constant" or n.output[0] in used]
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def _check_same_nodes(graphs: list[onnx.GraphProto]) -> None:
    def signature(graph: onnx.GraphProto) -> list:
        return [(n.op_type, list(n.input), list(n.output), [a.SerializeToString() for a in n.attribute])
                for n in graph.node if n.op_type != "Constant"]

    reference = signature(graphs[0])
    for number, graph in enumerate(graphs[1:], 1):
        nodes = signature(graph)
        if len(nodes) != len(reference):
            raise NotOneGraph(f"shape set {number} has {len(nodes)} nodes, set 0 has {len(reference)}")
        for left, right in zip(reference, nodes):
            if left != right:
                raise NotOneGraph(f"shape set {number} differs at node {right[0]} -> {right[2]} (set 0: {left[0]} -> "
                                  f"{left[2]}): the export folded another graph at this shape")


def _fit(values: list[int], dims: list[Dim]):
    """(dim, a, b) with values == a * dim.values + b for integer a, b, from the first dim that fits; else None."""
    for dim in dims:
        x = np.asarray(dim.values, dtype=np.int64)
        y = np.asarray(values, dtype=np.int64)
        if x[1] == x[0]:
            continue
        a, remainder = divmod(int(y[1] - y[0]), int(x[1] - x[0]))
        b = int(y[0] - a * x[0])
        if remainder == 0 and np.array_equal(a * x + b, y):
            return dim, a, b
    return None


class _Builder:
    """Nodes that compute shape-derived constants, read once per (input, axis)."""

    def __init__(self, prefix: str = "shape_generic"):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.prefix = prefix
        self._read: dict[tuple[str, int], str] = {}
        self._count = 0

    def _name(self, what: str) -> str:
        self._count += 1
        return f"{self.prefix}/{what}_{self._count}"

    def const(self, value) -> str:
        name = self._name("const")
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def dim(self, dim: Dim) -> str:
        """A [1] int64 tensor holding `dim` read from its input's shape."""
        key = (dim.input, dim.axis)
        if key not in self._read:
            shape = self._name("shape")
            self.nodes.append(helper.make_node("Shape", [dim.input], [shape], name=shape))
            out = self._name(f"{dim.symbol}")
            self.nodes.append(helper.make_node("Gather", [shape, self.const(np.array([dim.axis], np.int64))], [out],
                                               name=out, axis=0))
            self._read[key] = out
        return self._read[key]

    def affine(self, dim: Dim, a: int, b: int) -> str:
        out = self.dim(dim)
        if a != 1:
            scaled = self._name("mul")
            factor = self.const(np.array([a], np.int64))
            self.nodes.append(helper.make_node("Mul", [out, factor], [scaled], name=scaled))
            out = scaled
        if b != 0:
            shifted = self._name("add")
            offset = self.const(np.array([b], np.int64))
            self.nodes.append(helper.make_node("Add", [out, offset], [shifted], name=shifted))
            out = shifted
        return out

    def vector(self, entries: list, name: str) -> None:
        """`name` = the concatenation of entries, each an int (fixed) or a tensor name (one computed element)."""
        pieces, fixed = [], []
        for entry in entries:
            if isinstance(entry, str):
                if fixed:
                    pieces.append(self.const(np.array(fixed, np.int64)))
                    fixed = []
                pieces.append(entry)
            else:
                fixed.append(int(entry))
        if fixed:
            pieces.append(self.const(np.array(fixed, np.int64)))
        self.nodes.append(helper.make_node("Concat", pieces, [name], name=name, axis=0))


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    found: dict[str, list] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            found.setdefault(name, []).append((node, position))
    return found


END = np.iinfo(np.int64).max  # a Slice end that reads to the axis end


def _slice_offsets(users, versions, differing, shapes, values) -> list | None:
    """Each differing entry of a Slice start/end constant as a fixed negative distance from its axis end (the
    same in every set and for every Slice reading it), or None when it is not one."""
    offsets = {}
    for node, position in users:
        if node.op_type != "Slice" or position not in (1, 2) or len(node.input) < 4:
            return None
        axes_name = node.input[3]
        for k in differing:
            distances = set()
            for version, model_shapes, axes in zip(versions, shapes, (v.get(axes_name) for v in values)):
                data = model_shapes.get(node.input[0])
                if data is None or axes is None:
                    return None
                axis = int(axes[k]) % len(data)
                distance = int(version[k]) - data[axis]
                # an end at (or past) the axis end reads to the end at every shape
                distances.add(END if position == 2 and distance >= 0 else distance)
            if len(distances) != 1:
                return None
            distance = distances.pop()
            if distance >= 0 and distance != END or offsets.setdefault(k, distance) != distance:
                return None
    return [offsets[k] for k in differing]


@dataclass
class _ShapeSets:
    """The fixed-shape graphs being made one: what the rewrite of each differing constant reads."""

    models: list[onnx.ModelProto]
    values: list[dict[str, np.ndarray]]  # each set's constants, by name
    dims: list[Dim]  # the input dims that vary between the sets

    @cached_property
    def shapes(self) -> list[dict[str, list[int]]]:
        """Each set's static tensor shapes: inferred only when a Slice constant needs them."""
        return [static_shapes(m) for m in self.models]


def _generic_vector(name: str, versions: list[np.ndarray], users: list, sets: _ShapeSets,
                    builder: _Builder) -> np.ndarray | None:
    """An integer vector that differs between the sets: a Reshape target with its one differing entry -1, or Slice
    starts/ends counted from the axis end (returned: no arithmetic needed); else each differing entry `a * dim + b`,
    computed by the builder's nodes under `name` (None)."""
    first = versions[0]
    differing = [k for k in range(first.size) if len({int(v[k]) for v in versions}) > 1]
    if users and all(node.op_type == "Reshape" and position == 1 for node, position in users) \
            and len(differing) == 1 and -1 not in first and 0 not in first:
        return np.where(np.arange(first.size) == differing[0], -1, first).astype(first.dtype)
    if users and all(node.op_type == "Slice" for node, _ in users):
        offsets = _slice_offsets(users, versions, differing, sets.shapes, sets.values)
        if offsets is not None:
            generic = first.copy()
            generic[differing] = offsets
            return generic
    entries: list = []
    for k in range(first.size):
        if k not in differing:
            entries.append(int(first[k]))
            continue
        fit = _fit([int(v[k]) for v in versions], sets.dims)
        if fit is None:
            raise NotOneGraph(f"constant {name} entry {k} = {[int(v[k]) for v in versions]} is no a*dim+b of "
                              f"a varying input dim ({[(d.input, d.axis, d.values) for d in sets.dims]})")
        entries.append(builder.affine(*fit))
    if first.dtype == np.int64:
        builder.vector(entries, name)
    else:
        builder.vector(entries, name + "/int64")
        builder.nodes.append(helper.make_node("Cast", [name + "/int64"], [name], name=name + "/cast",
                                              to=helper.np_dtype_to_tensor_dtype(first.dtype)))
    return None


def _largest_corner(versions: list[np.ndarray]) -> np.ndarray | None:
    """The largest set's table when every set's is its leading corner, else None."""
    largest = max(versions, key=lambda v: v.size)
    if all(v.ndim == largest.ndim and all(a <= b for a, b in zip(v.shape, largest.shape))
           and np.array_equal(v, largest[tuple(slice(0, n) for n in v.shape)]) for v in versions):
        return largest
    return None


def _table_prefix(name: str, largest: np.ndarray, versions: list[np.ndarray], dims: list[Dim],
                  builder: _Builder) -> None:
    """`name` as the builder's Slice of the largest table to each set's sizes, each varying axis `a * dim + b`."""
    axes = [axis for axis in range(largest.ndim) if len({v.shape[axis] for v in versions}) > 1]
    ends = []
    for axis in axes:
        fit = _fit([v.shape[axis] for v in versions], dims)
        if fit is None:
            raise NotOneGraph(f"table {name} axis {axis} sizes {[v.shape[axis] for v in versions]} are no "
                              "a*dim+b of a varying input dim")
        ends.append(builder.affine(*fit))
    table = builder.const(largest)
    builder.vector(ends, name + "/ends")
    builder.nodes.append(helper.make_node(
        "Slice", [table, builder.const(np.zeros(len(axes), np.int64)), name + "/ends",
                  builder.const(np.asarray(axes, np.int64))], [name], name=name + "/prefix"))


def _generic_constant(name: str, versions: list[np.ndarray], users: list, sets: _ShapeSets,
                      builder: _Builder) -> np.ndarray | None:
    """The constant `name` (its value in each set) written for every set: its shape-generic value when it needs no
    arithmetic, else None with the builder's nodes computing it; NotOneGraph when it is neither a shape nor a table
    prefix."""
    first = versions[0]
    if first.dtype.kind in "iu" and first.ndim == 1 and all(v.shape == first.shape for v in versions):
        return _generic_vector(name, versions, users, sets, builder)
    largest = _largest_corner(versions)
    if largest is None:
        raise NotOneGraph(f"constant {name} ({first.dtype}, shapes {[tuple(v.shape) for v in versions]}) differs "
                          "between the shape sets and is neither a shape nor the leading corner of its largest set: "
                          "such a table has to be a graph input (export it as one, as CosyVoice3's RoPE tables are)")
    _table_prefix(name, largest, versions, sets.dims, builder)
    return None


def _assembled(sets: _ShapeSets, builder: _Builder, rewritten: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Set 0's model with its differing constants replaced (by `rewritten` values, or by the builder's nodes, which
    go first) and its varying input and output dims named by their symbols."""
    computed = {output for node in builder.nodes for output in node.output}
    replaced = computed | set(rewritten)

    out = onnx.ModelProto()
    out.CopyFrom(sets.models[0])
    graph = out.graph
    initializers = [t for t in graph.initializer if t.name not in replaced]
    initializers += [numpy_helper.from_array(value, name) for name, value in rewritten.items()]
    initializers += builder.initializers
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    nodes = [n for n in graph.node if not (n.op_type == "Constant" and n.output[0] in replaced)]
    del graph.node[:]
    graph.node.extend(builder.nodes + nodes)  # the shape nodes read graph inputs only: they can go first
    symbol_of = {(d.input, d.axis): d.symbol for d in sets.dims}
    for graph_input in graph.input:
        for axis, dim in enumerate(graph_input.type.tensor_type.shape.dim):
            if (graph_input.name, axis) in symbol_of:
                dim.ClearField("dim_value")
                dim.dim_param = symbol_of[(graph_input.name, axis)]
    outputs = [_output_dims(m.graph) for m in sets.models]
    for graph_output in graph.output:
        for axis, dim in enumerate(graph_output.type.tensor_type.shape.dim):
            sizes = tuple(o[graph_output.name][axis] for o in outputs)
            if len(set(sizes)) > 1:
                dim.ClearField("dim_value")
                dim.dim_param = next((d.symbol for d in sets.dims if d.values == sizes), f"{graph_output.name}_{axis}")
    del graph.value_info[:]  # the fixed shapes of set 0: stale for every other set
    return out


def shape_generic(models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """One graph that accepts every shape set of `models` (fixed-shape exports of one model, in set order) and
    computes exactly what each of them computes at its own shapes; NotOneGraph names what stops it."""
    if len(models) < 2:
        raise NotOneGraph("a shape-generic graph needs at least two shape sets")
    models = [own_small_constants(m) for m in models]
    graphs = [m.graph for m in models]
    dims = varying_dims(models)
    _check_same_nodes(graphs)
    sets = _ShapeSets(models, [constant_values(g) for g in graphs], dims)
    if any(set(v) != set(sets.values[0]) for v in sets.values[1:]):
        raise NotOneGraph("the shape sets hold different constants (names differ)")
    consumers = _consumers(graphs[0])
    builder = _Builder()
    rewritten: dict[str, np.ndarray] = {}  # constant name -> its shape-generic value (no arithmetic needed)
    for name, first in sets.values[0].items():
        versions = [v[name] for v in sets.values]
        if all(v.shape == first.shape and np.array_equal(v, first) for v in versions[1:]):
            continue
        generic = _generic_constant(name, versions, consumers.get(name, []), sets, builder)
        if generic is not None:
            rewritten[name] = generic
    return _assembled(sets, builder, rewritten)
