"""The fp16 floor: what plain fp16 arithmetic of the same graph reaches, measured on the host, so that a failing
simulator gate can tell "the conversion lost fidelity" (a bug) from "these weights are fp16-sensitive" (a
property of the checkpoint).

The floor graph is the ONNX with every fp32 initializer rounded to fp16 (the engine stores weights as fp16)
and `Cast(fp16) -> Cast(fp32)` after every graph input and every fp32 node output, run in onnxruntime. Casting
the graph to fp16 instead does not do this: onnxruntime's CPU kernels compute fp16 ops in fp32 and do not
round their intermediates (measured: `x + 1536 - 1536` comes back unrounded); a Cast pair does round, and
onnxruntime keeps it (a lossy round trip is not a redundant cast). Inside one node the host still works in
fp32 (a Conv accumulates in fp32, like the NPU), so the floor is "every tensor the NPU stores is fp16".

Gates: the simulator must be within `FLOOR_MARGIN_DB` of min(floor, FLOOR_CAP_DB) (`floor_gap_verdict`); the
absolute `min_simulator_snr_db` stays its own gate, and `simulator_advice` words its failure by which of the
two failed."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkaudio.board.verdict import Verdict, at_most

# The simulator may sit this far below the host fp16 floor before the conversion is blamed. The floor rounds
# after every ONNX node while the NPU fuses (Conv+Add+Relu round once), uses its own exp/sigmoid tables and
# reorders reductions: on the default engines the simulator sits 3.5 dB above to 1.2 dB below the floor
# (bench/fp16_floor.py), and a Kokoro row-form W=200 engine measured 4.6 dB below it with the error in a stage the
# row form leaves alone; a conversion fault (fp16 weights underflowing after a fold, an overflow, a wrong layout)
# costs 10 dB and more (the planted fold: 24 dB). 6 dB, the board self-test's own margin, keeps both apart.
FLOOR_MARGIN_DB = 6.0
# Above this both figures are far past any audible or gated level (the board gate caps the build figure at
# 60 dB too): a 90 dB floor and a 62 dB simulator is not a conversion bug.
FLOOR_CAP_DB = 60.0
GAP_UNIT = "dB below floor"
RAW_SUFFIX = "__fp32"  # a node's own (unrounded) output, renamed; the rounded value keeps the original name


def _float_values(model: onnx.ModelProto) -> set[str]:
    """Names of every fp32 tensor in the graph (inputs, node outputs), by shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    graph = inferred.graph
    return {value.name for value in [*graph.input, *graph.value_info, *graph.output]
            if value.type.tensor_type.elem_type == TensorProto.FLOAT}


def fp16_rounded(model: onnx.ModelProto) -> onnx.ModelProto:
    """The floor graph: fp32 initializers rounded to fp16 values and every fp32 input and node output passed
    through Cast(fp16) -> Cast(fp32), names and I/O unchanged (a new model; `model` is not modified)."""
    floats = _float_values(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT:
            values = numpy_helper.to_array(tensor)
            graph.initializer[index].CopyFrom(numpy_helper.from_array(
                values.astype(np.float16).astype(np.float32), tensor.name))
    initializers = {tensor.name for tensor in graph.initializer}

    def round_trip(source: str, target: str) -> list[onnx.NodeProto]:
        half = f"{target}__fp16"
        return [helper.make_node("Cast", [source], [half], name=f"{half}_cast", to=TensorProto.FLOAT16),
                helper.make_node("Cast", [half], [target], name=f"{target}_cast", to=TensorProto.FLOAT)]

    nodes: list[onnx.NodeProto] = []
    renamed_inputs = {}
    for value in graph.input:
        if value.name in floats and value.name not in initializers:
            renamed_inputs[value.name] = f"{value.name}__in16"
            nodes += round_trip(value.name, renamed_inputs[value.name])
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name in renamed_inputs:
                node.input[position] = renamed_inputs[name]
        rounded = []
        for position, name in enumerate(node.output):
            if name and name in floats:
                node.output[position] = name + RAW_SUFFIX
                rounded += round_trip(name + RAW_SUFFIX, name)
        nodes += [node, *rounded]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # stale for the renamed raw outputs; onnxruntime infers its own
    return out


def rounded_count(model: onnx.ModelProto) -> int:
    """How many tensors `fp16_rounded` rounds (its Cast pairs)."""
    return sum(1 for node in model.graph.node if node.op_type == "Cast" and node.name.endswith("__fp16_cast"))


def floor_gap(simulator_db: float, floor_db: float) -> float:
    """dB the simulator lies below the fp16 floor, the floor capped at FLOOR_CAP_DB (negative: above it)."""
    if math.isnan(simulator_db) or math.isnan(floor_db):
        return math.nan
    capped = min(floor_db, FLOOR_CAP_DB)
    if math.isinf(capped) and math.isinf(simulator_db) and capped == simulator_db:
        return 0.0
    return capped - simulator_db


def floor_gap_verdict(name: str, simulator_db: float, floor_db: float, margin_db: float = FLOOR_MARGIN_DB) -> Verdict:
    """Gate: the simulator within `margin_db` of the host fp16 floor of the same graph (capped at FLOOR_CAP_DB)."""
    gap = floor_gap(simulator_db, floor_db)
    detail = (f"simulator {simulator_db:.2f} dB, plain fp16 of the graph {floor_db:.2f} dB"
              + (f" (capped at {FLOOR_CAP_DB:g})" if floor_db > FLOOR_CAP_DB else ""))
    # Its own unit: a dB figure where lower is better, so it never reads as an SNR (the summary's worst SNR).
    return at_most(f"fp16_floor_gap[{name}]", gap, margin_db, GAP_UNIT, detail)


def simulator_advice(output: str, simulator_db: float, floor_db: float, gap_passed: bool, min_snr_db: float,
                     layers: list[str] = (), family: str | None = None) -> str:
    """What to do about output `output` whose simulator SNR or floor-gap gate failed, in the words of issue 15."""
    where = f" at {', '.join(layers)}" if layers else ""
    if not gap_passed:
        return (f"[{output}] the engine is {floor_gap(simulator_db, floor_db):.1f} dB below plain fp16 of the same "
                f"graph ({floor_db:.2f} dB): the conversion lost fidelity{where}; `convert diagnose ONNX --target T "
                "--selfcheck NPZ` prints the per-layer error table")
    return (f"[{output}] plain fp16 of this graph is already at {floor_db:.2f} dB (the engine: {simulator_db:.2f} dB): "
            "these weights are fp16-sensitive, the conversion is not at fault; listen with "
            f"`convert check {family or '<family>'}`, "
            f"then lower min_simulator_snr_db (--min-snr-db, now {min_snr_db:g}) for this checkpoint if that is "
            "acceptable")
