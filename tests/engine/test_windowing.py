"""The measurements behind `convert build --window` (rkaudio/engine/windowing.py) on graphs whose reach is known by
construction: a conv stack's context is its receptive radius (one frame less fails the interior bar), the hop is an
upsampler's stride, and every op that reads the whole time axis is named (attention, a norm over time, a mean over
time, a recurrence), while a conv stack is not."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

from rkaudio.core.errors import SetupError
from rkaudio.engine import windowing
from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.fold import fold_fixed

CHANNELS = 8


def _export(module, path: Path, frames: int = 96, dynamic: dict | None = None) -> onnx.ModelProto:
    import torch

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.randn(1, CHANNELS, frames),), str(path), input_names=["latent"],
                          output_names=["audio"], opset_version=17, dynamo=False,
                          dynamic_axes=dynamic if dynamic is not None else {"latent": {2: "time"}})
    return onnx.load(str(path))


def conv_stack(kernel: int = 5, layers: int = 3, stride: int = 1):
    """`layers` convs of `kernel` (reach (kernel // 2) * layers frames each side), then a ConvTranspose of `stride`."""
    import torch

    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Conv1d(CHANNELS, CHANNELS, kernel, padding=kernel // 2), torch.nn.Tanh()]
    blocks.append(torch.nn.ConvTranspose1d(CHANNELS, 1, stride, stride=stride))
    return torch.nn.Sequential(*blocks)


def _with(layer_after_conv):
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(CHANNELS, CHANNELS, 3, padding=1)
            self.after = layer_after_conv()

        def forward(self, latent):
            return self.after(self.conv(latent))

    return Model()


def _mean_over_time():
    import torch

    class Centre(torch.nn.Module):
        def forward(self, x):
            return x - x.mean(dim=2, keepdim=True)

    return _with(Centre)


def _attention():
    import torch

    class SelfAttention(torch.nn.Module):  # every frame's output weighs every frame (legacy export keeps T dynamic)
        def forward(self, x):
            frames = x.transpose(1, 2)
            weights = torch.softmax(frames @ x / CHANNELS ** 0.5, dim=-1)
            return (weights @ frames).transpose(1, 2)

    return _with(SelfAttention)


def _gru():
    import torch

    class Recurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(CHANNELS, CHANNELS, batch_first=True)

        def forward(self, x):
            return self.gru(x.transpose(1, 2))[0].transpose(1, 2)

    return _with(Recurrent)


REACHING = {
    "attention": (_attention, ("Softmax", "MatMul")),
    "norm": (lambda: _with(lambda: __import__("torch").nn.InstanceNorm1d(CHANNELS)), ("InstanceNormalization",)),
    "reduction": (_mean_over_time, ("ReduceMean",)),
    "recurrence": (_gru, ("GRU",)),
}


@pytest.mark.parametrize("kind", sorted(REACHING))
def test_an_op_across_the_whole_time_axis_is_named(tmp_path, kind):
    make, op_types = REACHING[kind]
    model = _export(make(), tmp_path / f"{kind}.onnx")
    axis = windowing.time_axis(model)
    with pytest.raises(SetupError) as refused:
        windowing.refuse_whole_axis(model, axis, 32, f"{kind}.onnx")
    message = str(refused.value)
    assert f"{kind} (" in message and "no finite context along latent axis 2" in message, message
    assert any(op in message for op in op_types), message


def test_a_conv_stack_reaches_nothing_across_the_axis(tmp_path):
    model = _export(conv_stack(), tmp_path / "convs.onnx")
    assert windowing.whole_axis_reach(model, windowing.time_axis(model), 32) == []


def test_the_context_is_the_receptive_radius_and_the_hop_the_stride(tmp_path):
    model = _export(conv_stack(kernel=5, layers=3, stride=4), tmp_path / "convs.onnx")
    axis = windowing.time_axis(model)
    full = OnnxBackend(model)
    assert windowing.hop_of(full, axis, model, 32) == 4
    latent = np.random.default_rng(1).standard_normal((1, CHANNELS, 128)).astype(np.float32)
    reference = full.run({"latent": latent})["audio"]
    windowed = OnnxBackend(fold_fixed(model, {"latent": [1, CHANNELS, 32]}))
    search = windowing.measure_context(windowed, latent, reference, 32, 4, axis, 90.0)
    assert search.context == 6, search.line()  # three kernel-5 convs read 2 + 2 + 2 frames each side
    assert search.worst_db[5] < 90.0 <= search.worst_db[6], search.line()  # a frame short: the gate's bar fails


def test_the_time_axis_is_asked_for_when_it_is_not_one_dynamic_axis(tmp_path):
    both = _export(conv_stack(), tmp_path / "both.onnx", dynamic={"latent": {0: "batch", 1: "channels", 2: "time"}})
    with pytest.raises(SetupError, match="--time-axis latent:AXIS"):
        windowing.time_axis(both)
    assert windowing.time_axis(both, "latent:2").axis == 2
    fixed = _export(conv_stack(), tmp_path / "fixed.onnx", dynamic={})
    with pytest.raises(SetupError, match="export the model with that axis dynamic"):
        windowing.time_axis(fixed)
    with pytest.raises(SetupError, match="no input 'mel'"):
        windowing.time_axis(both, "mel:1")


def test_a_second_input_is_refused_whether_or_not_the_latent_is_named(tmp_path):
    """A speaker embedding beside the latent: the walk feeds one input per window, so naming the latent does not
    make the graph walkable, and the refusal says so once instead of asking for --time-axis first."""
    import torch

    class Conditioned(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(CHANNELS, CHANNELS, 3, padding=1)

        def forward(self, latent, speaker):
            return self.conv(latent + speaker)

    path = tmp_path / "conditioned.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Conditioned().eval(), (torch.randn(1, CHANNELS, 32), torch.randn(1, CHANNELS, 1)),
                          str(path), input_names=["latent", "speaker"], output_names=["audio"], opset_version=17,
                          dynamo=False, dynamic_axes={"latent": {2: "time"}})
    for spelt in (None, "latent:2"):
        with pytest.raises(SetupError, match=r"2 inputs \(latent, speaker\).*with the others folded in"):
            windowing.time_axis(onnx.load(str(path)), spelt)
