"""Where a target runs each node of an ONNX graph, read off a placement table measured per toolkit and SoC.

The table (`placement_table.json`, package data) maps a node's *signature* to "npu" or "cpu". bench/placement.py
writes it (`make bench NAME=placement ARGS=--write-table`): it cuts each signature's node out of the models it is
given with its neighbourhood, builds that small probe graph for every toolkit and SoC, and reads the CPU ops the
compiler placed for the node. A signature the table lacks is never guessed: `cpu_nodes` reports it as
"unmeasured", and the bench measures it once the model that holds it is added to its list. The table is per node:
what the compiler does to a pattern larger than a probe's neighbourhood is not in it (`--verify` there names it).

The table's JSON: `toolkits` {toolkit: {target: {signature: "npu" | "cpu"}}}; `cpu_layers` (the same nesting: the
op types of the compiler's CPU layers behind each "cpu" entry, e.g. a ConvTranspose whose input pad runs on the CPU
shows `exConvTransposePad`); `notes` (the same nesting: how an entry was measured where that was not plain: the
answer of each model's probe where they disagree, the table saying "cpu" then, or a probe measured with a smaller
neighbourhood because the compiler refused the larger); `unresolved` (the same nesting: signatures probed without
a clear answer, each with the reason: a probe the build refused, a CPU layer that names no probe); `measured`
(when, at which commit, from which models, how); `regenerate` (the command that rewrites it)."""
from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from rkaudio.board.soc import ROW_SAMPLES_LIMIT, Target
from rkaudio.core.errors import SetupError
from rkaudio.core.onnx_graph import constant_values, node_attr, static_shapes

TABLE_FILE = Path(__file__).with_name("placement_table.json")

# Elementwise ops that broadcast their operands (numpy rules): which axes an operand is broadcast along is part of
# the key (a per-channel [1, C, 1] operand is another lowering than a full [1, C, T] one).
BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "Mod", "PRelu", "Where",
    "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "And", "Or", "Xor", "BitShift"})
# Ops that only reshape (no data moves in ONNX's row-major view): keyed by how the axes regroup.
RESHAPES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})
REDUCES = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                     "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
# Convolution stride, pad and kernel buckets, measured on 1-D convolutions. Stride: a ConvTranspose of stride 9..16
# puts its pad on the CPU (rk3588, rk3566 with 2.3.2) or itself (rk3566 with 2.5.0) where kernel 32 at stride 8
# stays on the NPU. Pad and kernel: past a pad of 15, or a kernel of 15 (rkaudio.board.soc.PADDED_KERNEL_LIMIT), a
# Conv's padding is split off as a Pad layer of its own, which runs on the CPU at some channel counts
# (`_channel_class`: [1, 4, 4096] with kernel 17 and pad 8 does on the RK3588 and RK3576 with 2.3.2, kernel 7 and
# pad 3 does not).
STRIDE_BUCKETS = ((1, "1"), (8, "2-8"))
PAD_BUCKETS = ((0, "0"), (15, "1-15"))
KERNEL_BUCKETS = ((15, "1-15"),)
# The axis an op takes when its attribute is left out (opset 13 on): the key holds it either way.
DEFAULT_AXIS = {"Softmax": -1, "LogSoftmax": -1, "Hardmax": -1, "LayerNormalization": -1, "Gather": 0,
                "GatherElements": 0, "Split": 0}


@dataclass(frozen=True)
class Placement:
    """One node and where the table says `target` runs it: "cpu", "npu", or "unmeasured" (its signature is not
    in the table, or its probe gave no clear answer: `detail` says which)."""

    node_name: str
    op_type: str
    signature: str
    where: str
    # "cpu" / "npu": the compiler's CPU layer types behind it, and how it was measured where that was not plain;
    # "unmeasured": why
    detail: str = ""


def signature(node: onnx.NodeProto, shapes: dict, constants: dict) -> str:
    """The key `node` is measured under: `Op[operands]->outputs facts...`, e.g. `Mul[c3b2,x1nn]->1nn`,
    `Transpose[x1un]->1nu [1,a,b]->[1,b,a]`, `Conv[x1nL,c3,c1]->1nL 1d channels=8k>8k groups=1 kernel=1-15
    stride=1 dilation>1 pads>15`, `Softmax[x1uuu]->1uuu axis=-1`.

    Why each part is in the key:
    - the op type, obviously;
    - each computed operand and each output as the class of each axis (`x1nL`: computed, [1, 64, 12800]; `_units`):
      `1` a unit axis, `n` a multiple of 8, `u` another count, `L` longer than ROW_SAMPLES_LIMIT (8,191); each
      constant operand as `c<rank>`, `-` for an omitted optional input. The compiler lays tensors out by rank, unit
      axes and alignment (rank-3 tensors become [N, C, 1, W], channels in groups of 8), and measured: a Conv whose
      output has one channel gets a CPU Transpose on the RK3566 (2.3.2) where three channels do not;
      InstanceNormalization over [1, 32, T] stays on the NPU of the RK3588 up to T = 8,192 and takes CPU Transposes
      from 10,000 on, and on the RK3566 stays on the NPU at T = 6,000 but not at 3,199 or 8,191. A constant operand
      is folded into weights where a computed one is a second input;
    - for broadcasting elementwise ops, `b<axes>` after an operand broadcast along those axes (right-aligned with
      the output): a per-channel [1, C, 1] scale is another lowering than a full [1, C, T] tensor;
    - for reshapes (Reshape, Squeeze, Unsqueeze, Flatten) and Transpose, the axis pattern: input axes lettered
      (`1` for a unit axis), each output axis as the letter it keeps, the letters it merges (`bc`) or a split part
      (`b1`, `b2`): the NPU moves data when a reshape crosses its channel/width layout, which the ranks alone hide;
    - axis attributes (Softmax, LayerNormalization, Concat, ...) and the axes a Reduce*, Slice or Pad works on,
      counted from the end (`-1` is the last axis whatever the rank): which axis, not how it is spelt;
    - Slice steps other than 1 (a negative step is a flip, a CPU op: rkaudio.gates.opscan), Pad's mode, Pow's
      constant exponent (x^2 is a multiply, x^0.5 a square root), Resize's modes and scaled axes;
    - Conv / ConvTranspose: 1-D or 2-D, input > output channels (`8k`: a multiple of 8, else the count:
      `_channel_class`), groups (1, depthwise, grouped), kernel, stride and pad buckets (KERNEL_BUCKETS,
      STRIDE_BUCKETS, PAD_BUCKETS, all measured), dilation > 1, output_padding: each chooses another lowering;
    - any other integer or string attribute verbatim (an op without a rule here keeps them all: finer, never wrong).
    Not in the key: float attributes (alpha, epsilon: numbers in the maths, not a code path), lengths beyond their
    class (measured: a Conv, its split Pad, a LeakyRelu and a Sin place alike from 6,000 to 32,768 samples),
    channel counts beyond their class but a Conv's, dtypes (the engines are fp16 builds of float graphs), and the
    neighbours: the compiler fuses patterns (Div-Erf-Add-Mul-Mul into one NPU GELU: a lone Erf is a CPU op on every
    SoC, a GELU's is not) and adds layout conversions between two nodes, so bench/placement.py measures each
    signature inside its node's own neighbourhood in each model that holds it, and `--verify` there builds the
    models whole and names what the table misses."""
    input_shape = _shape(node.input[0], shapes, constants) if node.input else None
    operands = [_operand(name, shapes, constants) for name in node.input]
    if node.op_type in BROADCASTING:
        operands = [token + _broadcast_axes(name, node, shapes, constants) for token, name in zip(operands, node.input)]
    produced = ",".join(_units(_shape(name, shapes, constants)) for name in node.output)
    facts = _facts(node, input_shape, shapes, constants)
    return " ".join([f"{node.op_type}[{','.join(operands)}]->{produced}", *facts])


def model_signatures(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    """(node, signature) of every node the compiler places, in graph order: Constant nodes and nodes of constant
    inputs only are folded by the build, never placed."""
    shapes = static_shapes(model, constants=False)
    constants = constant_values(model.graph)
    return [(node, signature(node, shapes, constants)) for node in model.graph.node
            if node.op_type != "Constant" and not all(name in constants for name in node.input if name)]


def load_table(path: Path = TABLE_FILE) -> dict:
    return json.loads(Path(path).read_text())


def placements(model: onnx.ModelProto, target: str, toolkit: str, table: dict | None = None) -> list[Placement]:
    """Where `target` built with `toolkit` runs every placed node of `model` (the folded graph the build compiles),
    in graph order. SetupError when the table measured no such toolkit and target."""
    table = load_table() if table is None else table
    target = Target(target)
    measured = table["toolkits"].get(toolkit, {})
    if target not in measured:
        cells = [f"{kit} {soc}" for kit, socs in table["toolkits"].items() for soc in socs]
        raise SetupError(f"the placement table measured no {target} with toolkit {toolkit} (it has: "
                         f"{', '.join(cells)}); add it to bench/placement.py and run "
                         f"`{table['regenerate']}`")
    where = measured[target]
    layers, notes, unresolved = (table.get(part, {}).get(toolkit, {}).get(target, {})
                                 for part in ("cpu_layers", "notes", "unresolved"))
    found = []
    for node, key in model_signatures(model):
        if key in where:
            detail = "; ".join(part for part in [", ".join(layers.get(key, [])), notes.get(key, "")] if part)
            found.append(Placement(node.name or node.output[0], node.op_type, key, where[key], detail))
        else:
            detail = (f"probed, no clear answer: {unresolved[key]}" if key in unresolved
                      else "no probe of this signature in the table")
            found.append(Placement(node.name or node.output[0], node.op_type, key, "unmeasured", detail))
    return found


def cpu_nodes(model: onnx.ModelProto, target: str, toolkit: str, table: dict | None = None) -> list[Placement]:
    """Every node the table says `target` (built with `toolkit`) runs on the CPU, and every node it has no answer
    for ("unmeasured", never guessed), in graph order."""
    return [placement for placement in placements(model, target, toolkit, table) if placement.where != "npu"]


def _shape(name: str, shapes: dict, constants: dict) -> tuple | None:
    if name in constants:
        return tuple(np.shape(constants[name]))
    return tuple(shapes[name]) if name in shapes else None


def _axis_class(dim: int) -> str:
    if dim == 1:
        return "1"
    if dim > ROW_SAMPLES_LIMIT:
        return "L"
    return "n" if dim % 8 == 0 else "u"


def _units(shape) -> str:
    """`1nu` for [1, 64, 199]: an axis class per axis (`_axis_class`: `1` unit, `n` a multiple of 8, `u` another
    count, `L` past ROW_SAMPLES_LIMIT); `()` for a scalar, `?` for an unknown shape."""
    if shape is None or None in shape:
        return "?"
    return "".join(_axis_class(dim) for dim in shape) or "()"


def _operand(name: str, shapes: dict, constants: dict) -> str:
    """`x1nn`: a computed operand and its unit pattern; `c3`: a constant of rank 3; `-`: an omitted input."""
    if not name:
        return "-"
    if name in constants:
        return f"c{np.ndim(constants[name])}"
    return "x" + _units(_shape(name, shapes, constants))


def _broadcast_axes(name: str, node: onnx.NodeProto, shapes: dict, constants: dict) -> str:
    """`b<axes>`: the output axes along which operand `name` has a unit dim and the output does not (right-aligned;
    the leading axes a lower-rank operand lacks follow from its rank)."""
    operand_shapes = [_shape(operand, shapes, constants) for operand in node.input if operand]
    shape = _shape(name, shapes, constants)
    if shape is None or any(s is None for s in operand_shapes):
        return ""
    output = np.broadcast_shapes(*operand_shapes)
    offset = len(output) - len(shape)
    axes = [offset + axis for axis, dim in enumerate(shape) if dim == 1 and output[offset + axis] > 1]
    return f"b{''.join(map(str, axes))}" if axes else ""


def _from_end(axes, rank: int | None) -> str:
    """Axes counted from the end (-1 the last), sorted: the same axis whatever the rank or the sign it is written
    with."""
    if rank is None:
        return ",".join(str(int(axis)) for axis in np.ravel(axes))
    return ",".join(str(axis) for axis in sorted({int(axis) % rank - rank for axis in np.ravel(axes)}))


def _letters(shape) -> list[str]:
    """A letter per non-unit axis, "1" per unit axis."""
    names = iter(string.ascii_lowercase)
    return ["1" if dim == 1 else next(names) for dim in shape]


def _regrouping(before, after) -> str:
    """`[1,a,b]->[1,a,b1,b2]`: how a reshape regroups the non-unit axes of `before` into those of `after`."""
    if before is None or after is None or None in before or None in after or np.prod(before) != np.prod(after):
        return "?"
    labels = _letters(before)
    out = ["1" if dim == 1 else "" for dim in after]
    kept_in = [(label, dim) for label, dim in zip(labels, before) if dim != 1]
    kept_out = [axis for axis, dim in enumerate(after) if dim != 1]
    i = j = 0
    while i < len(kept_in):
        group_in, size_in = [kept_in[i]], kept_in[i][1]
        group_out, size_out = [kept_out[j]], after[kept_out[j]]
        i, j = i + 1, j + 1
        while size_in != size_out:
            if size_in < size_out:
                group_in.append(kept_in[i])
                size_in *= kept_in[i][1]
                i += 1
            else:
                group_out.append(kept_out[j])
                size_out *= after[kept_out[j]]
                j += 1
        name = "".join(label for label, _ in group_in)
        for part, axis in enumerate(group_out, 1):
            out[axis] = name if len(group_out) == 1 else f"{name}{part}"
    return f"[{','.join(labels)}]->[{','.join(out)}]"


def _transposed(shape, perm) -> str:
    if shape is None:
        return f"perm={','.join(map(str, perm))}"
    labels = _letters(shape)
    perm = perm if perm is not None else list(range(len(shape)))[::-1]
    return f"[{','.join(labels)}]->[{','.join(labels[axis] for axis in perm)}]"


def _bucket(fact: str, value: int, buckets) -> str:
    """`stride=1`, `stride=2-8`, `stride>8`: the bucket of `value`."""
    for bound, name in buckets:
        if value <= bound:
            return f"{fact}={name}"
    return f"{fact}>{buckets[-1][0]}"


def _channel_class(count) -> str:
    """`8k` for a multiple of 8 channels, else the count. Measured (toolkit 2.3.2): a Conv with a dilation and
    pads > 15 splits the pad off, and that Pad runs on the CPU unless its input and output channels are multiples
    of 8 (of 4 on the RK3566; 12 also stays on the NPU on the RK3588 and RK3576): 1..7, 9..11, 13..31, 33, 36 and
    100 channels put it on the CPU there, 8, 16, 24, 32 and 40 on none; so does a kernel past 15 at 4 channels but
    not at 8, 16 or 64. With toolkit 2.5.0 no such Pad ran on the CPU."""
    if count is None:
        return "?"
    return "8k" if count % 8 == 0 else str(count)


def _conv_facts(node: onnx.NodeProto, input_shape, output_shape, constants: dict) -> list[str]:
    weight = constants.get(node.input[1]) if len(node.input) > 1 else None
    spatial = len(node_attr(node, "kernel_shape", ())) or (np.ndim(weight) - 2 if weight is not None else None)
    group = node_attr(node, "group", 1)
    channels = input_shape[1] if input_shape and len(input_shape) > 1 else None
    groups = "1" if group == 1 else "depthwise" if group == channels else "grouped"
    strides = node_attr(node, "strides", ()) or (1,)
    dilations = node_attr(node, "dilations", ()) or (1,)
    pads = node_attr(node, "pads", ()) or (0,)
    channels_out = output_shape[1] if output_shape and len(output_shape) > 1 else None
    kernel = node_attr(node, "kernel_shape", ()) or (np.shape(weight)[2:] if weight is not None else ())
    facts = [f"{spatial}d" if spatial else "?d", f"channels={_channel_class(channels)}>{_channel_class(channels_out)}",
             f"groups={groups}", _bucket("kernel", max(kernel), KERNEL_BUCKETS) if len(kernel) else "kernel=?",
             _bucket("stride", max(strides), STRIDE_BUCKETS), "dilation>1" if max(dilations) > 1 else "dilation=1",
             _bucket("pads", max(pads), PAD_BUCKETS)]
    auto_pad = node_attr(node, "auto_pad", b"NOTSET")
    if auto_pad not in (b"NOTSET", "NOTSET"):
        facts.append(f"auto_pad={auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad}")
    if any(node_attr(node, "output_padding", ())):
        facts.append("output_padding")
    return facts


def _constant(node: onnx.NodeProto, index: int, constants: dict):
    return constants.get(node.input[index]) if len(node.input) > index and node.input[index] else None


def _facts(node: onnx.NodeProto, input_shape, shapes: dict, constants: dict) -> list[str]:
    """The attributes and constant operands of `node` that choose how it is lowered (signature's docstring)."""
    op, rank = node.op_type, (len(input_shape) if input_shape is not None else None)
    if op in ("Conv", "ConvTranspose"):
        return _conv_facts(node, input_shape, _shape(node.output[0], shapes, constants), constants)
    if op in RESHAPES:
        return [_regrouping(input_shape, _shape(node.output[0], shapes, constants))]
    if op == "Transpose":
        return [_transposed(input_shape, node_attr(node, "perm"))]
    if op == "Pow":
        exponent = _constant(node, 1, constants)
        return [f"exp={float(np.ravel(exponent)[0]):g}"] if exponent is not None and np.size(exponent) == 1 else []
    if op in REDUCES:
        axes = _constant(node, 1, constants)
        axes = node_attr(node, "axes") if axes is None else axes
        return [f"axes={'all' if axes is None or np.size(axes) == 0 else _from_end(axes, rank)}",
                f"keepdims={node_attr(node, 'keepdims', 1)}"]
    if op == "Slice":
        starts, axes, steps = (_constant(node, index, constants) for index in (1, 3, 4))
        if axes is None and starts is not None:
            axes = np.arange(np.size(starts))
        facts = [f"axes={'?' if axes is None else _from_end(axes, rank)}"]
        if steps is not None and np.any(np.asarray(steps) != 1):
            facts.append(f"steps={','.join(str(int(step)) for step in np.ravel(steps))}")
        return facts
    if op == "Pad":
        pads = _constant(node, 1, constants)
        mode = node_attr(node, "mode", b"constant")
        facts = [f"mode={mode.decode() if isinstance(mode, bytes) else mode}"]
        if pads is not None and rank:
            padded = [axis for axis in range(rank) if pads[axis] or pads[axis + rank]]
            facts.append(f"axes={_from_end(padded, rank) if padded else 'none'}")
        return facts
    if op == "Resize":
        facts = [f"{name}={value.decode() if isinstance(value, bytes) else value}"
                 for name, value in sorted((a.name, onnx.helper.get_attribute_value(a)) for a in node.attribute)
                 if isinstance(value, (bytes, str, int))]
        output = _shape(node.output[0], shapes, constants)
        if input_shape is not None and output is not None:
            scaled = [axis for axis, (a, b) in enumerate(zip(input_shape, output)) if a != b]
            facts.append(f"axes={_from_end(scaled, rank) if scaled else 'none'}")
        return facts
    return _generic_facts(node, rank)


def _generic_facts(node: onnx.NodeProto, rank: int | None) -> list[str]:
    """Integer and string attributes verbatim (axis / axes counted from the end, the default axis filled in),
    sorted; floats left out."""
    attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
    if node.op_type in DEFAULT_AXIS:
        attributes.setdefault("axis", DEFAULT_AXIS[node.op_type])
    facts = []
    for name, value in sorted(attributes.items()):
        if name in ("axis", "axes"):
            facts.append(f"{name}={_from_end(value, rank)}")
        elif isinstance(value, bytes):
            facts.append(f"{name}={value.decode()}")
        elif isinstance(value, int) or (isinstance(value, list) and value and all(isinstance(v, int) for v in value)):
            facts.append(f"{name}={value if isinstance(value, int) else ','.join(map(str, value))}")
    return facts
