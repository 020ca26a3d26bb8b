"""Checkpoints with a low fp32 floor, made from real or random VITS weights (Piper's voice, Inflect's decode.onnx):
the tests of the floor-relative export gates (rkaudio.gates.fp32_floor) use them.

`offset_flow` is exact in maths: in the reverse flow the first coupling it names adds `offset` to the half it
writes (its `post` bias, since it computes x1 - post(h)), the next reads that half with its `pre` bias
compensated, and the third, which writes the same half again, takes `offset` off. In fp32 that half then holds
values near `offset`, so its O(1) content keeps only ~6e-8 * offset of absolute precision."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


def offset_flow(model: onnx.ModelProto, offset: float, couplings: tuple[str, str, str]) -> onnx.ModelProto:
    """`model` with `offset` carried through the reverse flow between the couplings named by their initializer
    prefixes (written, read, restored: three consecutive couplings in reverse order); a new model."""
    written, read, restored = couplings
    out = onnx.ModelProto()
    out.CopyFrom(model)
    weights = {tensor.name: tensor for tensor in out.graph.initializer}

    def edit(name, change):
        value = numpy_helper.to_array(weights[name]).astype(np.float64)
        weights[name].CopyFrom(numpy_helper.from_array(change(value).astype(np.float32), name))

    pre = numpy_helper.to_array(weights[f"{read}.pre.weight"]).astype(np.float64)  # [hidden, half, 1]
    edit(f"{written}.post.bias", lambda bias: bias - offset)
    edit(f"{read}.pre.bias", lambda bias: bias - offset * pre.sum(axis=(1, 2)))
    edit(f"{restored}.post.bias", lambda bias: bias + offset)
    return out
