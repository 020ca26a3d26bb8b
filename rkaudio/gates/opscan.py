"""Problem-op scan at export time: nodes that `rknn.build` rejects or places on the CPU, by name.

Cheap to run on the exported ONNX, before the build: each finding names the node, its type and why it
hurts, so the family can fold it away (`rkaudio.surgery.graph.fold.fold_fixed`, what `convert build --fix` runs) or
rewrite it while it is still torch."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import onnx

from rkaudio.core.onnx_graph import constant_values
from rkaudio.board.verdict import Verdict, at_most

# Shape glue: only legal while something is dynamic; with every input pinned it is constant.
_SHAPE_GLUE = ("shape glue that is constant once every input is pinned: `convert build MODEL.onnx --fix` folds it "
               "(--shape NAME=DIMS pins a dynamic input)")

# op type -> reason, for nodes that are a problem whatever their inputs.
ALWAYS = {
    "Shape": _SHAPE_GLUE + "; left in, rknn.build can abort inside fold_constant with no traceback",
    "Size": _SHAPE_GLUE,
    "ConstantOfShape": _SHAPE_GLUE,
    "Range": _SHAPE_GLUE + "; a data-dependent Range has no fixed-shape form",
    "NonZero": "output shape depends on the data: RKNN has no dynamic shapes",
    "Loop": "control flow: RKNN compiles straight-line graphs only; unroll it at export",
    "If": "control flow: RKNN compiles straight-line graphs only; export the branch taken",
    "Scan": "control flow: RKNN compiles straight-line graphs only; unroll it at export",
    "ScatterND": "runs on the CPU; write the update as a Concat/Slice or keep the buffer outside the graph",
    "Floor": "runs on the CPU on every target; a shielded fp16 rounding or a polynomial stays on the NPU",
    "Round": "runs on the CPU, with a CPU Reshape beside it on every use",
    "Cast": "runs on the CPU ('dataconvert type -1 is unsupport') and can give wrong values; "
    "keep the graph in float",
    "Resize": "interpolation may be placed on the CPU or rejected depending on its mode; "
    "an upsampling ConvTranspose or a repeat by Reshape stays on the NPU",
    "Equal": "comparison runs on the CPU; precompute masks as float inputs",
}

# op type -> (reason, targets where the layer table places it on the NPU).
PER_TARGET = {
    "Sin": ("runs on the CPU on rk3588 and rk3566 (NPU on rk3576); a polynomial sine stays on the NPU",
            frozenset({"rk3576"})),
}


@dataclass(frozen=True)
class ProblemOp:
    """One node that the build rejects or moves to the CPU, and why."""

    name: str
    op_type: str
    reason: str

    def line(self) -> str:
        return f"{self.op_type} {self.name or '(unnamed)'}: {self.reason}"


def _operand_reason(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> str | None:
    """Reasons that depend on an operand: computed from the data, or a constant of a bad kind."""
    def computed(index: int) -> bool:
        return len(node.input) > index and bool(node.input[index]) and node.input[index] not in constants

    if node.op_type == "Pad" and (computed(1) or computed(3)):
        return "pads computed from the data (length-dependent F.pad): rknn.build needs constant pads; pin the shapes and fold"
    if node.op_type == "GatherElements" and computed(1):
        return "index computed from the data: runs on the CPU"
    if node.op_type in ("Reshape", "Expand", "Tile") and computed(1):
        return "target shape computed from the data: `convert build --fix` folds it to a constant"
    if node.op_type == "Slice" and any(computed(i) for i in range(1, 5)):
        return "bounds computed from the data: `convert build --fix` folds them to constants"
    if node.op_type == "Slice" and len(node.input) > 4 and np.any(constants.get(node.input[4], 1) < 0):
        return "negative step (a flip) runs on the CPU; flip the neighbouring weights instead"
    return None


def scan(model: onnx.ModelProto | str | Path, target: str | None = None) -> list[ProblemOp]:
    """Problem nodes of the main graph in graph order; `target` drops ops that target runs on the NPU."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    constants = constant_values(model.graph)
    found = []
    for node in model.graph.node:
        reason = ALWAYS.get(node.op_type)
        if node.op_type in PER_TARGET:
            text, npu_targets = PER_TARGET[node.op_type]
            reason = None if target in npu_targets else text
        reason = reason or _operand_reason(node, constants)
        if reason:
            found.append(ProblemOp(node.name, node.op_type, reason))
    return found


def verdict(problems: list[ProblemOp], max_problem_ops: int = 0) -> Verdict:
    """Gate on the number of problem ops; the detail names the first few nodes."""
    names = ", ".join(f"{p.op_type}:{p.name or '(unnamed)'}" for p in problems[:8])
    more = f" and {len(problems) - 8} more" if len(problems) > 8 else ""
    return at_most("problem ops", len(problems), max_problem_ops, "nodes", names + more)


def warn(problems: list[ProblemOp], stream: TextIO | None = None) -> None:
    """Print one warning line per problem node (nothing when the graph is clean)."""
    stream = stream or sys.stderr
    if problems:
        print(f"warning: {len(problems)} node(s) the NPU build rejects or runs on the CPU:", file=stream)
    for problem in problems:
        print("  " + problem.line(), file=stream)
