"""Run a decoder's last upsampling levels in polyphase form: each full-rate sample's phase stacked on channels.

Why the NPU needs it: a window's full-rate axes (93 latent slices x 256 = 23,808 samples for a medium Piper voice;
256 x 64 = 16,384 already at the second of Inflect's four levels) exceed the time field of the op registers on
rk3576 (0x3fff) and rk3566 (0x1fff): the compiler logs REGTASK field overflows for every layer past it. From the
first overflowing level down, a tensor of P*L samples is held as P phases at the coarse length L (sample P*t + p
of channel c is channel p*C + c at time t): the level's ConvTranspose of stride s turns into a Conv that makes P*s
phases of P, every later ConvTranspose multiplies the phases by its stride the same way, every full-rate conv
becomes a conv over phase-stacked channels (weights rearranged, zeros where a tap falls in another phase),
element-wise ops are unchanged, a nearest-upsampled mask is read at the coarse rate, and the phases are
interleaved back (0/1 ConvTransposes, in stages) only where the graph leaves this form. Exact: only weights are
rearranged."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.board.contract import EngineContract
from rkaudio.board.soc import TIME_FIELD_LIMIT
from rkaudio.board.vits import VitsWindow
from rkaudio.core.onnx_graph import GraphIndex, constant_value, node_attr
from rkaudio.surgery.graph.mask import upsample_levels

# The widest interleave stage: rknn.build lowers a wider 0/1 ConvTranspose through a CPU pad (measured on rk3566: one
# stride-32 interleave to 65,536 samples, 1 CPU op exConvTransposePad and 186 REGTASK lines; stages of 4 then 8 build
# clean on rk3566 and rk3576). The widest stage goes last so every stage reads a short axis: stages of 8, 2, 2 there
# log 14 REGTASK lines on rk3576, where the 2-stages read 16,384 and 32,768 samples.
MAX_INTERLEAVE_STRIDE = 8
UNARY = {"LeakyRelu", "Tanh", "Relu", "Sigmoid", "Neg", "Exp", "Abs", "Sin"}
BINARY = {"Add", "Sub", "Mul", "Div", "Pow"}  # with a phase-layout tensor, a per-sample scalar or a scalar constant


class PolyphaseError(ValueError):
    """The levels asked for have an op this pass cannot rewrite exactly."""


def overflowing_levels(target: str | None, window: int, strides: list[int]) -> int:
    """How many trailing upsampling levels of a `window`-slice decoder have a full-rate axis longer than the
    target's time field (rkaudio.board.soc.TIME_FIELD_LIMIT, which says what was measured): those levels run in
    polyphase form, at the length of the last level that fits. 0 on a target without the limit (rk3588)."""
    limit = TIME_FIELD_LIMIT.get(target or "")
    if limit is None:
        return 0
    lengths = [window * math.prod(strides[: depth + 1]) for depth in range(len(strides))]
    return sum(length > limit for length in lengths)


def phase_count(strides: list[int], levels: int) -> int:
    """The phases the last `levels` upsampling levels end in: the product of their strides (1 for none)."""
    return math.prod(strides[len(strides) - levels :])


def decoder_in_phases(model: onnx.ModelProto, decoder_input: str, strides: list[int], levels: int):
    """A windowed decoder with its last `levels` upsampling levels in polyphase form (the export's step shared by the
    families), and the phase count its contract records (None for no level); a SetupError naming the remedy when the
    levels cannot take that form."""
    from rkaudio.core.errors import SetupError

    if not levels:
        return model, None
    try:
        return polyphase_levels(model, decoder_input, levels), phase_count(strides, levels)
    except PolyphaseError as error:
        raise SetupError(f"the window's full-rate axes overflow the target's op registers and the decoder's last "
                         f"{levels} upsampling level(s) cannot run in polyphase form ({error}); use a smaller "
                         "--window") from None


def lacks_phases(contract: EngineContract, target: str | None) -> bool:
    """Whether an exported VITS window (its window, level strides and polyphase phases) holds fewer phases than
    `target`'s time field needs: an export for a wider field, which the build could only refuse. False for a
    contract that is no VITS window's (an encoder's, a foreign ONNX's)."""
    try:
        window = VitsWindow.of(contract)
    except ValueError:
        return False
    if not window.strides:
        return False
    needed = phase_count(window.strides, overflowing_levels(target, window.window, window.strides))
    return (window.polyphase or 1) < needed


def interleave_stages(phases: int) -> list[int]:
    """The strides of the interleave stages of `phases` phases: the widest divisor up to MAX_INTERLEAVE_STRIDE last,
    then the same for what is left (32 -> [4, 8], 4 -> [4], 12 -> [2, 6])."""
    stages = []
    while phases > 1:
        divisors = [a for a in range(2, MAX_INTERLEAVE_STRIDE + 1) if phases % a == 0]
        stage = max(divisors) if divisors else phases  # a prime past the widest stage: one stage of it
        stages.insert(0, stage)
        phases //= stage
    return stages


def source_phase(offset: int, phases: int) -> tuple[int, int]:
    """Full-rate offset `offset` from sample P*t -> (its phase, its coarse time offset) in a P-phase tensor."""
    return offset % phases, offset // phases


def phase_conv(taps: np.ndarray, shifts: list[int], stride: int, phases: int, bias: np.ndarray | None):
    """A full-rate op y[n] = sum_j taps[:, :, j] x[m] with stride*m = n + shifts[j] (a Conv: stride 1, shift
    j*d - pad; a ConvTranspose of stride s: shift pad - j, taps present where it divides), from a P-phase input to a
    P*stride-phase output, as one Conv on the coarse axis: (weight [P*s*Cout, P*Cin, K'], bias, pads)."""
    c_out, c_in, _ = taps.shape
    out_phases = phases * stride
    placed = []  # (output phase, input phase, coarse offset, tap)
    for r in range(out_phases):
        for j, shift in enumerate(shifts):
            if (r + shift) % stride == 0:
                placed.append((r, *source_phase((r + shift) // stride, phases), j))
    low, high = min(p[2] for p in placed), max(p[2] for p in placed)
    weight = np.zeros((out_phases * c_out, phases * c_in, high - low + 1), dtype=taps.dtype)
    for r, q, offset, j in placed:
        weight[r * c_out : (r + 1) * c_out, q * c_in : (q + 1) * c_in, offset - low] += taps[:, :, j]
    tiled = np.tile(bias, out_phases) if bias is not None else np.zeros(out_phases * c_out, dtype=np.float32)
    return weight, tiled, [-low, high]


def _nearest_source(index: GraphIndex, name: str, phases: int) -> str | None:
    """The tensor `name` repeats `phases` times per sample through a chain of all-ones ConvTransposes with kernel =
    stride (exact nearest upsampling, the decoder mask's per-level upsamplers): every phase of it is that tensor."""
    while phases > 1:
        node = index.producer.get(name)
        if node is None or node.op_type != "ConvTranspose" or len(node.input) > 2 or any(node_attr(node, "pads", [0])):
            return None
        stride = int(node_attr(node, "strides", [1])[0])
        weight = constant_value(index, node.input[1])
        if weight is None or weight.shape != (1, 1, stride) or not np.all(weight == 1) or phases % stride:
            return None
        name, phases = node.input[0], phases // stride
    return name


class _PhaseGraph:
    """A copy of a decoder being rewritten node by node: the rewritten nodes, the tensors held in phase layout, and
    the interleaves already made of them."""

    def __init__(self, model: onnx.ModelProto):
        self.index = GraphIndex(model)  # of the original graph: its constants and producers
        self.model = onnx.ModelProto()
        self.model.CopyFrom(model)
        self.layout: dict[str, tuple[int, int]] = {}  # phase-layout tensors -> (channels per phase, phases)
        self.nodes: list[onnx.NodeProto] = []
        self.interleaved: dict[str, str] = {}  # phase-layout tensor -> its full-rate interleave

    def phases_of(self, name: str) -> int:
        return self.layout[name][1] if name in self.layout else 1

    def initializer(self, name: str, value: np.ndarray) -> str:
        value = value.astype(np.float32) if value.dtype.kind == "f" else value
        self.model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def as_conv(self, node: onnx.NodeProto, taps: np.ndarray, shifts: list[int], stride: int, phases: int) -> None:
        """Replace `node` (a full-rate conv with these taps) by its coarse Conv on `phases` input phases."""
        bias = constant_value(self.index, node.input[2]) if len(node.input) > 2 and node.input[2] else None
        weight, bias, pads = phase_conv(taps, shifts, stride, phases, bias)
        result = node.output[0]
        self.nodes.append(helper.make_node(
            "Conv", [node.input[0], self.initializer(f"{result}_polyphase_w", weight),
                     self.initializer(f"{result}_polyphase_b", bias)],
            [result], name=f"{node.name or result}_polyphase", pads=pads))
        self.layout[result] = (taps.shape[0], phases * stride)

    def interleave(self, name: str) -> str:
        """Phase layout [1, P*C, L] -> [1, C, P*L] by 0/1 ConvTransposes (kernel = stride = a, `interleave_stages`):
        stage a turns P phases at L into P/a phases at a*L (phase p' at a*t + k is phase (P/a)*k + p' at t). Exact,
        and ops the NPU runs where a Reshape/Transpose interleave becomes a long Gather or a CPU Reshape."""
        c, phases = self.layout[name]
        current = name
        for stage, a in enumerate(interleave_stages(phases)):
            select = np.zeros((phases * c, phases // a * c, a), dtype=np.float32)
            for k in range(a):
                for p in range(phases // a):
                    select[(phases // a * k + p) * c + np.arange(c), p * c + np.arange(c), k] = 1.0
            result = f"{name}_interleaved" if phases == a else f"{name}_interleave{stage}"
            self.nodes.append(helper.make_node(
                "ConvTranspose", [current, self.initializer(f"{result}_w", select)], [result],
                name=f"{name}_interleave{stage}", kernel_shape=[a], strides=[a]))
            current, phases = result, phases // a
        return current

    def upsampler(self, node: onnx.NodeProto) -> None:
        """A ConvTranspose of the levels: a Conv making its stride times the phases of its input."""
        weight = constant_value(self.index, node.input[1])
        stride = int(node_attr(node, "strides", [1])[0])
        pads = list(node_attr(node, "pads", [0, 0]))
        if pads[0] != pads[1] or weight.shape[2] - 2 * pads[0] != stride or int(node_attr(node, "group", 1)) != 1 \
                or any(node_attr(node, "output_padding", [0])):
            raise PolyphaseError(f"{node.name!r}: output length must be exactly stride x input "
                                 "(kernel - 2*pad = stride, no groups or output padding)")
        self.as_conv(node, weight.transpose(1, 0, 2), [pads[0] - j for j in range(weight.shape[2])], stride,
                     self.phases_of(node.input[0]))

    def takes_conv(self, node: onnx.NodeProto) -> bool:
        """Whether `node` is a full-rate Conv on a phase-layout input that `conv` rewrites (ungrouped, stride 1)."""
        return node.op_type == "Conv" and node.input[0] in self.layout and int(node_attr(node, "group", 1)) == 1 \
            and int(node_attr(node, "strides", [1])[0]) == 1

    def conv(self, node: onnx.NodeProto) -> None:
        """A length-keeping Conv below the first level: a Conv over the phase-stacked channels."""
        conv_pads = list(node_attr(node, "pads", [0, 0]))
        weight = constant_value(self.index, node.input[1])
        dilation = int(node_attr(node, "dilations", [1])[0])
        if conv_pads[0] + conv_pads[1] != dilation * (weight.shape[2] - 1):
            raise PolyphaseError(f"conv {node.name!r} does not keep its length ('same' padding needed)")
        self.as_conv(node, weight, [j * dilation - conv_pads[0] for j in range(weight.shape[2])], 1,
                     self.phases_of(node.input[0]))

    def elementwise(self, node: onnx.NodeProto, phased: list[str]) -> bool:
        """A unary or binary op whose every input is in the phase layout of its first phased one, a scalar, a
        per-channel constant (tiled over the phases), or a nearest-upsampled signal (read at the coarse rate): kept
        as it is, on the phases. False when one is not."""
        if node.op_type not in UNARY and node.op_type not in BINARY:
            return False
        channels, phases = self.layout[phased[0]]
        rewritten = []
        for name in node.input:
            value = constant_value(self.index, name)
            if name in self.layout and self.layout[name][1] == phases or value is not None and value.size == 1:
                rewritten.append(name)
            elif value is not None and value.shape == (1, channels, 1):  # per channel (a Snake's alpha): per phase
                rewritten.append(self.initializer(f"{name}_x{phases}_phases", np.tile(value, (1, phases, 1))))
            elif name not in self.layout and (source := _nearest_source(self.index, name, phases)) is not None:
                rewritten.append(source)  # every phase of a nearest-upsampled signal is the coarse signal
            else:
                return False
        node.input[:] = rewritten
        self.layout[node.output[0]] = self.layout[phased[0]]
        self.nodes.append(node)
        return True

    def leave(self, node: onnx.NodeProto, phased: list[str]) -> None:
        """Leaving the polyphase form: `node` reads the interleave of each phase-layout input."""
        for name in phased:
            if name not in self.interleaved:
                self.interleaved[name] = self.interleave(name)
        node.input[:] = [self.interleaved.get(i, i) for i in node.input]
        self.nodes.append(node)

    def finish(self) -> onnx.ModelProto:
        """The rewritten model, a graph output still in phase layout interleaved back under its own name."""
        for output in self.model.graph.output:
            if output.name in self.layout:
                inner = f"{output.name}_polyphase"
                for node in self.nodes:
                    node.input[:] = [inner if i == output.name else i for i in node.input]
                    node.output[:] = [inner if o == output.name else o for o in node.output]
                self.layout[inner] = self.layout.pop(output.name)
                self.nodes.append(helper.make_node("Identity", [self.interleave(inner)], [output.name]))
        del self.model.graph.node[:]
        self.model.graph.node.extend(self.nodes)
        # a folded graph annotates its tensors' shapes, which the phase layout changes: keep only the others
        kept = [info for info in self.model.graph.value_info if info.name not in self.layout]
        del self.model.graph.value_info[:]
        self.model.graph.value_info.extend(kept)
        return self.model


def polyphase_levels(model: onnx.ModelProto, decoder_input: str, levels: int) -> onnx.ModelProto:
    """Rewrite the last `levels` upsampling levels below `decoder_input` (their ConvTransposes and every layer
    below the first of them) to run on their phases at the coarse rate (exact), interleaving back where the graph
    leaves that form."""
    if levels < 1:
        return model
    depth = upsample_levels(model, decoder_input)
    deepest = max(depth.values())
    if levels > deepest:
        raise PolyphaseError(f"{levels} polyphase levels asked, the decoder below {decoder_input!r} has {deepest}")
    first_level = deepest - levels + 1

    rewrite = _PhaseGraph(model)
    for original in model.graph.node:
        node = onnx.NodeProto()
        node.CopyFrom(original)
        phased = [i for i in node.input if i in rewrite.layout]
        if node.op_type == "ConvTranspose" and depth.get(node.output[0], 0) >= first_level:
            rewrite.upsampler(node)
        elif not phased:
            rewrite.nodes.append(node)
        elif rewrite.takes_conv(node):
            rewrite.conv(node)
        elif not rewrite.elementwise(node, phased):
            rewrite.leave(node, phased)
    return rewrite.finish()
