"""Constants beyond the fp16 range: the engine stores every weight and constant as fp16 (w16a16), where
anything past 65504 is inf, and one inf reaches every output (measured: a random codebook table with
entries of 1.1e5 turned the whole Qwen3 vocoder engine to inf). Checked on the ONNX before the build, so the
failure names the tensor instead of surfacing as -inf dB after a long compile."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from rkaudio.core.onnx_graph import constant_tensors
from rkaudio.board.verdict import Verdict, at_most

FP16_MAX = 65504.0
ADVICE = ("a constant beyond the fp16 range (|x| > 65504) is inf in the engine: rescale it where the graph is "
          "built (fold the scale into the op that consumes it) so every constant fits fp16")


def out_of_range(model: onnx.ModelProto) -> list[tuple[str, float]]:
    """(name, max |value|) of every floating-point constant with a finite fp32 value past the fp16 range."""
    found = []
    for name, tensor in constant_tensors(model.graph):
        if tensor.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
            continue
        values = numpy_helper.to_array(tensor)
        if values.size and float(np.abs(values).max()) > FP16_MAX:
            found.append((name, float(np.abs(values).max())))
    return sorted(found, key=lambda item: -item[1])


def fp16_constants_verdict(model: onnx.ModelProto) -> Verdict:
    """Gate: no constant past the fp16 range; the detail names the three largest."""
    found = out_of_range(model)
    detail = "; ".join(f"{name} max|x| {value:.6g}" for name, value in found[:3]) + (" ..." if len(found) > 3 else "")
    return at_most("fp16_constants", len(found), 0, "tensors", detail or "every constant within +-65504")
