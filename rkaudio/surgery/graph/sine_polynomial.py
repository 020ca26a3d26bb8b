"""Every float32 Sin of any ONNX graph as a polynomial after a period reduction: Sin runs on the CPU on rk3588 and
rk3566, so a graph keeping one pays two NPU<->CPU round trips per Sin.

The graph-level twin of `rkaudio.surgery.modules.snake`'s `round` form, for a user ONNX without its model source.
- A squared Sin (a Snake: `Sin(u)` whose only consumer is `Pow(s, 2)` or `Mul(s, s)`, as transformers' DAC
  `Snake1d` exports `sin(alpha*x).pow(2)`): sin(u)^2 = pi*h(u/pi) with h the Snake's even degree-8 polynomial
  (`sin2_coefficients(SIN2_DEGREE)`) of r = w - round(w), w = u/pi; pi is folded into the coefficients.
- Any other Sin: sin(u) = p(r), r = w - round(w) in [-1/2, 1/2], w = u/(2*pi), p an odd degree-9 minimax
  polynomial of sin(2*pi*r).
round(w) = Relu(w + M) - M with M = ROUND_SHIFT_FP32 = 1.5*2^23: exact round-to-nearest in fp32 for |w| < 2^22. This
pass writes the fp32 form (the exact twin a build compares with); the fp16 engine graph needs M = 1536 instead,
which the caller swaps in with `rkaudio.surgery.graph.round_shift.fp16_round_shift(sine_polynomial(model))`."""
from __future__ import annotations

import functools
import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkaudio.core.onnx_graph import GraphIndex, constant_value, drop_unused_initializers, live_nodes
from rkaudio.surgery.modules.snake import ROUND_SHIFT_FP32, minimax, sin2_coefficients

# The Snake's round-form degree. Degree 6 (the families' form, its error of fp16's order) left a reduced DAC decoder,
# 29 Snakes in series, at 39.3 dB against its exact form, under the graph's own fp16 floor (36.7 dB measured on the
# NPU simulator); degree 8 costs one multiply-add more per Snake and errs 36x less.
SIN2_DEGREE = 8
SIN_DEGREE = 9  # the lowest odd degree under 1e-4: degree 7 misses by 2.5e-4
# max|pi*h(u/pi) - sin(u)^2| and max|p(r) - sin(u)| over a period, float64 on a 200,001-point grid.
MAX_ABS_ERROR_SIN2 = 2.3e-5
MAX_ABS_ERROR_SIN = 5.9e-6
# The SNR one rewritten Snake x + sin(alpha*x)^2/alpha (x standard normal, alpha per channel in [0.5, 2]) keeps
# against its exact form: 95.9 dB in float64 (degree 6: 65.0). A deep graph amplifies it; `--fix` judges the whole
# graph against its fp16 floor instead (rkaudio.engine.doctor.APPROXIMATION_MARGIN_DB).
TOLERANCE_DB = 95.0


@functools.cache
def sin_turn_coefficients() -> tuple[float, ...]:
    """Odd minimax fit (powers 1, 3, .., SIN_DEGREE) of sin(2*pi*r) on r in [-1/2, 1/2]: a whole period after the
    round reduction, so no Sin is left for the NPU to hand to the CPU."""
    return tuple(minimax(lambda r: np.sin(2 * np.pi * r), tuple(range(1, SIN_DEGREE + 1, 2)), 0.0, 0.5))


def _squaring(index: GraphIndex, sin: onnx.NodeProto, outputs: set[str]) -> onnx.NodeProto | None:
    """The node squaring `sin`'s output when it is its only reader (`Pow(s, 2)` or `Mul(s, s)`), else None."""
    readers = index.consumers.get(sin.output[0], [])
    if len(readers) != 1 or sin.output[0] in outputs:
        return None
    square = readers[0]
    if square.op_type == "Mul" and list(square.input) == [sin.output[0]] * 2:
        return square
    if square.op_type == "Pow" and square.input[0] == sin.output[0]:
        exponent = constant_value(index, square.input[1])
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 2.0:
            return square
    return None


def _matches(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto | None]]:
    """(Sin, its squaring node or None) for every Sin of a float32 tensor (the constants written are float32)."""
    index = GraphIndex(model)
    inferred = onnx.shape_inference.infer_shapes(model).graph
    float32 = {value.name for value in [*inferred.input, *inferred.value_info]
               if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    outputs = {o.name for o in model.graph.output}
    return [(node, _squaring(index, node, outputs)) for node in index.nodes
            if node.op_type == "Sin" and node.domain in ("", "ai.onnx") and node.input[0] in float32]


def find_sine_polynomial(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes the pass replaces (each float32 Sin, and the Pow/Mul squaring a Snake's): Sin runs on
    the CPU of rk3588 and rk3566. An unnamed node is named by its first output."""
    return [node.name or node.output[0] for match in _matches(model) for node in match if node is not None]


def _polynomial_nodes(u: str, out: str, squared: bool) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing sin(u)^2 (`squared`) or sin(u) into `out`, and their scalar constants, named after `out`."""
    prefix = f"{out}/sine_polynomial"
    constants, nodes = [], []

    def name(step: str) -> str:
        return f"{prefix}/{step}"

    def scalar(step: str, value: float) -> str:
        constants.append(numpy_helper.from_array(np.array(value, np.float32), name(step)))
        return name(step)

    def node(op: str, inputs: list[str], step: str) -> str:
        nodes.append(helper.make_node(op, inputs, [name(step)], name=name(step)))
        return name(step)

    w = node("Mul", [u, scalar("turns", 1.0 / math.pi if squared else 0.5 / math.pi)], "w")
    shift = scalar("round_shift", ROUND_SHIFT_FP32)
    kept = node("Relu", [node("Add", [w, shift], "shifted")], "shifted_kept")  # Relu: the pair is not folded away
    r = node("Sub", [w, node("Sub", [kept, shift], "rounded")], "r")
    v = node("Pow", [r, scalar("two", 2.0)], "v")  # one unary pass on the NPU, where r*r reads two tensors
    coefficients = [math.pi * b for b in sin2_coefficients(SIN2_DEGREE)] if squared else sin_turn_coefficients()
    horner = scalar(f"c{len(coefficients) - 1}", coefficients[-1])
    for i in range(len(coefficients) - 2, -1, -1):
        horner = node("Add", [node("Mul", [v, horner], f"v_h{i + 1}"), scalar(f"c{i}", coefficients[i])], f"h{i}")
    # sin^2 is even without a constant term (v * h), sin is odd (r * h).
    nodes.append(helper.make_node("Mul", [v if squared else r, horner], [out], name=name("out")))
    return nodes, constants


def sine_polynomial(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every float32 Sin (and a Snake's squared Sin) replaced by a round-reduced polynomial: Sin runs
    on the CPU of rk3588 and rk3566. fp32 rounding shift: the engine graph needs `fp16_round_shift` after it."""
    matches = _matches(model)
    if not matches:
        raise ValueError("no float32 Sin in the graph: nothing for sine_polynomial to rewrite")
    replaced = {}  # the output of the last node of each match -> the nodes replacing the match
    removed = set()
    initializers = []
    for sin, square in matches:
        last = square or sin
        nodes, constants = _polynomial_nodes(sin.input[0], last.output[0], square is not None)
        replaced[last.output[0]] = nodes
        removed.add(sin.output[0])
        initializers += constants
    out = onnx.ModelProto()
    out.CopyFrom(model)
    rewritten = []
    for node in out.graph.node:  # the replacement stands where its last node stood: its input u is made before
        if node.output and node.output[0] in replaced:
            rewritten += replaced[node.output[0]]
        elif not (node.output and node.output[0] in removed):
            rewritten.append(node)
    del out.graph.node[:]
    out.graph.node.extend(live_nodes(rewritten, {o.name for o in out.graph.output}))
    out.graph.initializer.extend(initializers)
    return drop_unused_initializers(out)
