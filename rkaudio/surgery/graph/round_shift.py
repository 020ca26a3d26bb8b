"""Swap the fp32 rounding shift of the `round` Snake sine (rkaudio.surgery.modules.snake) for its fp16 value."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from rkaudio.surgery.modules.snake import ROUND_SHIFT_FP16, ROUND_SHIFT_FP32


def fp16_round_shift(model):
    """Swap the fp32 rounding shift 1.5*2^23 for 1536 in an exported graph: fp16 overflows at 65504, and
    1536 + w rounds w to an integer in fp16 (unit ulp), which is the rounding the NPU then does natively."""
    out = onnx.ModelProto()
    out.CopyFrom(model)

    def swap(tensor):
        value = numpy_helper.to_array(tensor)
        if value.dtype.kind == "f" and value.size == 1 and float(value.reshape(())) == ROUND_SHIFT_FP32:
            tensor.CopyFrom(numpy_helper.from_array(np.full(value.shape, ROUND_SHIFT_FP16, value.dtype), tensor.name))
            return 1
        return 0

    swapped = sum(swap(t) for t in out.graph.initializer)
    for node in out.graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                swapped += swap(attribute.t)
    if not swapped:
        raise ValueError("no fp32 rounding shift found: was the graph exported with sine form 'round'?")
    return out
