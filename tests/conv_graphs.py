"""Tiny fixed-shape ONNX graphs built with onnx.helper (deterministic weights), and their fixtures `graph` and
`inputs_npz`: the engine and gates tests build them (tests/conftest.py offers the fixtures to every folder)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.core.contract import make_contract
from rkaudio.core.contract import set_contract


def conv_graph(path: Path, channels: int = 8, length: int = 64, *, activation: str | None = None,
               blocks: int = 1, dims=None, gain: float = 1.0, seed: int = 0) -> Path:
    """x [1,C,T] -> `blocks` times: c = Conv1d(k=3, pad 1)(h); h = activation(c) + c (`activation` a unary
    op such as Sin or Floor; without it h = c + c) -> y. `dims` overrides the input's dims (e.g. a symbolic
    'T'); `gain` scales the weights (fp16 overflow tests). Carries an rkaudio contract."""
    rng = np.random.default_rng(seed)
    nodes, initializers, h = [], [], "x"
    for block in range(blocks):
        weight = (rng.standard_normal((channels, channels, 3)) / np.sqrt(3 * channels) * gain).astype(np.float32)
        bias = (0.1 * rng.standard_normal(channels)).astype(np.float32)
        initializers += [numpy_helper.from_array(weight, f"w{block}"), numpy_helper.from_array(bias, f"b{block}")]
        conv = f"conv{block}"
        nodes.append(helper.make_node("Conv", [h, f"w{block}", f"b{block}"], [conv], name=conv, pads=[1, 1],
                                      kernel_shape=[3]))
        branch = conv
        if activation:
            branch = f"{activation.lower()}{block}"
            nodes.append(helper.make_node(activation, [conv], [branch], name=branch))
        h = "y" if block == blocks - 1 else f"h{block}"
        nodes.append(helper.make_node("Add", [branch, conv], [h], name=f"add{block}"))
    shape = dims if dims is not None else [1, channels, length]
    graph = helper.make_graph(nodes, "build_test", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="engine-build-tests")
    model = set_contract(model, make_contract("build_test", "decoder", "main", "build_test.exec_plan",
                                              exec_params={"overlap": 0}))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def graph(tmp_path):
    """`graph(name, **conv_graph_kwargs)` writes tmp_path/<name>.onnx and returns its path."""
    return lambda name, **kwargs: conv_graph(tmp_path / f"{name}.onnx", **kwargs)


@pytest.fixture
def inputs_npz(tmp_path):
    """`inputs_npz(onnx_path)`: standard-normal (seed 0) self-check inputs for a graph, as an .npz path."""
    def write(onnx_path: Path, scale: float = 1.0) -> Path:
        from rkaudio.toolkit.session import graph_io

        specs, _ = graph_io(onnx.load(str(onnx_path)))
        rng = np.random.default_rng(0)
        path = tmp_path / f"{Path(onnx_path).stem}.inputs.npz"
        np.savez(path, **{s.name: (scale * rng.standard_normal(s.shape)).astype(np.float32) for s in specs})
        return path
    return write
