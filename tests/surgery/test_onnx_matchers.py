"""The ONNX passes `convert build --fix` applies to any user graph (sine_polynomial, instance_norm, weight_fold,
input_phases), each on a tiny torch export with its pattern, run in onnxruntime and compared with an independent numpy
float64 reference of the model's computation: the exact passes to fp32 rounding, the sine polynomial within its
declared tolerance. Each also finds nothing on a graph without its pattern, and a planted wrong rewrite misses the
reference badly."""
from __future__ import annotations

import io
import math

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from rkaudio.board.numeric import snr_db
from rkaudio.gates.fp16_floor import fp16_rounded
from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.instance_norm import find_instance_norm, instance_norm
from rkaudio.surgery.graph.round_shift import fp16_round_shift
from rkaudio.surgery.graph.sine_polynomial import (MAX_ABS_ERROR_SIN, MAX_ABS_ERROR_SIN2, SIN2_DEGREE, TOLERANCE_DB,
                                                   find_sine_polynomial, sin_turn_coefficients, sine_polynomial)
from rkaudio.surgery.graph.weight_fold import find_weight_fold, weight_fold
from rkaudio.surgery.modules.snake import sin2_coefficients

CHANNELS, FRAMES = 8, 2048
EXACT_RELATIVE = 1e-5  # max|d| / max|reference| of an exact pass: fp32 rounding
WRONG_BY_DB = 30.0  # how far below a pass's level a planted wrong rewrite must land


def _export(module: nn.Module, x: np.ndarray, constant_folding: bool = True) -> onnx.ModelProto:
    buffer = io.BytesIO()
    torch.onnx.export(module.eval(), (torch.from_numpy(x),), buffer, opset_version=17, dynamo=False,
                      do_constant_folding=constant_folding, input_names=["x"], output_names=["y"])
    return onnx.load_from_string(buffer.getvalue())


def _run(model: onnx.ModelProto, x: np.ndarray, taps: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    with OnnxBackend(model, extra_outputs=taps, threads=1) as backend:
        return backend.run({"x": x}, ["y", *taps])


def _ops(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node}


def _conv1d(x, weight, bias):
    """float64 Conv1d, kernel 3, padding 1."""
    padded = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (1, 1)))
    frames = x.shape[-1]
    out = sum(np.einsum("oi,nit->not", weight[:, :, k].astype(np.float64), padded[:, :, k:k + frames])
              for k in range(weight.shape[-1]))
    return out + bias.astype(np.float64)[None, :, None]


def _params(conv: nn.Conv1d) -> tuple[np.ndarray, np.ndarray]:
    return conv.weight.detach().numpy(), conv.bias.detach().numpy()


def _replace_initializer(model: onnx.ModelProto, name: str, value: np.ndarray) -> onnx.ModelProto:
    planted = onnx.ModelProto()
    planted.CopyFrom(model)
    tensor = next(t for t in planted.graph.initializer if t.name == name)
    tensor.CopyFrom(numpy_helper.from_array(np.asarray(value, np.float32), name))
    return planted


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, 4, FRAMES)).astype(np.float32)


# --- sine_polynomial --------------------------------------------------------------------------------------------

class DacSnake(nn.Module):
    """Conv1d -> transformers' DAC Snake1d (alpha per channel in [0.5, 2]) -> Conv1d; the first conv's weights
    scaled so the Snake sees a standard-normal-like input (the tolerance's measurement)."""

    def __init__(self):
        from transformers.models.dac.modeling_dac import Snake1d

        super().__init__()
        torch.manual_seed(0)
        self.before, self.after = nn.Conv1d(4, CHANNELS, 3, padding=1), nn.Conv1d(CHANNELS, 4, 3, padding=1)
        self.snake = Snake1d(CHANNELS)
        with torch.no_grad():
            self.before.weight.mul_(math.sqrt(3.0))
            self.snake.alpha.copy_(torch.linspace(0.5, 2.0, CHANNELS).view(1, -1, 1))

    def forward(self, x):
        return self.after(self.snake(self.before(x)))

    def reference(self, x, sin2=lambda u: np.sin(u) ** 2):
        """float64: the Snake's squared sine given as `sin2`."""
        h = _conv1d(x, *_params(self.before))
        alpha = self.snake.alpha.detach().numpy().astype(np.float64)
        return _conv1d(h + sin2(alpha * h) / (alpha + 1e-9), *_params(self.after))


class PlainSine(nn.Module):
    """Conv1d -> sin(10 h) (arguments over several periods) -> Conv1d."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.before, self.after = nn.Conv1d(4, CHANNELS, 3, padding=1), nn.Conv1d(CHANNELS, 4, 3, padding=1)

    def forward(self, x):
        return self.after(torch.sin(10.0 * self.before(x)))

    def reference(self, x):
        return _conv1d(np.sin(10.0 * _conv1d(x, *_params(self.before))), *_params(self.after))


def _sin2_polynomial(u):
    """float64 pi * h(u/pi) with exact rounding: what the rewrite computes."""
    r = u / np.pi - np.round(u / np.pi)
    return np.pi * sum(b * r ** (2 * i + 2) for i, b in enumerate(sin2_coefficients(SIN2_DEGREE)))


def test_declared_sine_errors_are_measured():
    """The module's max errors are the polynomials' own, float64, to 2 digits."""
    r = np.linspace(-0.5, 0.5, 200001)
    sin_error = np.abs(sum(c * r ** (2 * i + 1) for i, c in enumerate(sin_turn_coefficients()))
                       - np.sin(2 * np.pi * r)).max()
    u = np.pi * r
    sin2_error = np.abs(_sin2_polynomial(u) - np.sin(u) ** 2).max()
    assert 0.99 * MAX_ABS_ERROR_SIN < sin_error <= MAX_ABS_ERROR_SIN < 1e-4
    assert 0.99 * MAX_ABS_ERROR_SIN2 < sin2_error <= MAX_ABS_ERROR_SIN2


def test_snake_sine_becomes_the_round_polynomial(x):
    snake = DacSnake()
    model = _export(snake, x)
    sin, square = (n for n in model.graph.node if n.op_type in ("Sin", "Pow") and n.name.startswith("/snake/"))
    assert find_sine_polynomial(model) == [sin.name, square.name]
    rewritten = sine_polynomial(model)
    onnx.checker.check_model(rewritten, full_check=True)
    assert "Sin" not in _ops(rewritten) and find_sine_polynomial(rewritten) == []
    y = _run(rewritten, x)["y"]
    polynomial = snake.reference(x, _sin2_polynomial)
    assert np.abs(y - polynomial).max() < EXACT_RELATIVE * np.abs(polynomial).max()  # the graph is the formula
    exact = snake.reference(x)
    assert snr_db(exact, y) >= TOLERANCE_DB
    assert snr_db(exact, _run(model, x)["y"]) > TOLERANCE_DB + WRONG_BY_DB  # the original graph: fp32 alone

    # the engine graph: the fp16 shift swapped in, every tensor rounded to fp16 (the NPU's arithmetic)
    engine = fp16_rounded(fp16_round_shift(rewritten))
    assert snr_db(exact, _run(engine, x)["y"]) > 40.0

    coefficient = next(t.name for t in rewritten.graph.initializer if t.name.endswith("/sine_polynomial/c1"))
    wrong_sign = _replace_initializer(rewritten, coefficient,
                                      -numpy_helper.to_array(next(t for t in rewritten.graph.initializer
                                                                  if t.name == coefficient)))
    assert snr_db(exact, _run(wrong_sign, x)["y"]) < TOLERANCE_DB - WRONG_BY_DB


def test_plain_sine_becomes_an_odd_polynomial_within_its_error(x):
    plain = PlainSine()
    model = _export(plain, x)
    (sin,) = (n for n in model.graph.node if n.op_type == "Sin")
    assert find_sine_polynomial(model) == [sin.name]
    rewritten = sine_polynomial(model)
    assert "Sin" not in _ops(rewritten)
    got = _run(rewritten, x, taps=(sin.input[0], sin.output[0]))  # the rewrite keeps the Sin's output name
    arguments = got[sin.input[0]].astype(np.float64)
    assert np.abs(arguments).max() > 3 * np.pi  # several periods: the reduction is exercised
    assert np.abs(got[sin.output[0]] - np.sin(arguments)).max() < MAX_ABS_ERROR_SIN + 2e-6  # + fp32 rounding
    exact = plain.reference(x)
    assert snr_db(exact, got["y"]) > TOLERANCE_DB  # 105 dB: the plain sine's polynomial errs less than the Snake's

    coefficient = next(t for t in rewritten.graph.initializer if t.name.endswith("/sine_polynomial/c1"))
    wrong_sign = _replace_initializer(rewritten, coefficient.name, -numpy_helper.to_array(coefficient))
    assert snr_db(exact, _run(wrong_sign, x)["y"]) < TOLERANCE_DB - WRONG_BY_DB


def test_sine_polynomial_finds_nothing_without_a_sine(x):
    model = _export(NormBetweenConvs("group_norm_8"), x)
    assert find_sine_polynomial(model) == []
    with pytest.raises(ValueError, match="no float32 Sin"):
        sine_polynomial(model)


# --- instance_norm ------------------------------------------------------------------------------------------------

class NormBetweenConvs(nn.Module):
    """Conv1d -> GroupNorm(groups, C) or InstanceNorm1d(C, affine) with a random affine -> Conv1d."""

    def __init__(self, norm: str):
        super().__init__()
        torch.manual_seed(2)
        self.before, self.after = nn.Conv1d(4, CHANNELS, 3, padding=1), nn.Conv1d(CHANNELS, 4, 3, padding=1)
        self.groups = {"group_norm_8": 8, "group_norm_2": 2}.get(norm)
        self.norm = nn.GroupNorm(self.groups, CHANNELS) if self.groups else nn.InstanceNorm1d(CHANNELS, affine=True)
        self.groups = self.groups or CHANNELS
        with torch.no_grad():
            self.before.bias.add_(3.0)  # channel means far from 0: the centring matters
            self.norm.weight.uniform_(0.5, 2.0)
            self.norm.bias.uniform_(-1.0, 1.0)

    def forward(self, x):
        return self.after(self.norm(self.before(x)))

    def reference(self, x, centred: bool = True):
        h = _conv1d(x, *_params(self.before))
        grouped = h.reshape(h.shape[0], self.groups, -1)
        mean = grouped.mean(axis=-1, keepdims=True)
        variance = ((grouped - mean) ** 2).mean(axis=-1, keepdims=True)
        normalised = ((grouped - mean) / np.sqrt(variance + self.norm.eps)).reshape(h.shape)
        weight, bias = (p.detach().numpy().astype(np.float64)[None, :, None]
                        for p in (self.norm.weight, self.norm.bias))
        return _conv1d(normalised * weight + bias, *_params(self.after))


@pytest.mark.parametrize("norm", ["group_norm_8", "group_norm_2", "instance_norm"])
def test_instance_norm_through_global_average_pool(x, norm):
    module = NormBetweenConvs(norm)
    model = _export(module, x)
    names = [n.name for n in model.graph.node if n.op_type == "InstanceNormalization"]
    assert names and find_instance_norm(model) == names
    rewritten = instance_norm(model)
    onnx.checker.check_model(rewritten, full_check=True)
    assert "InstanceNormalization" not in _ops(rewritten) and "GlobalAveragePool" in _ops(rewritten)
    gains = [n for n in rewritten.graph.node if n.name.endswith("/gap_norm/gain")]
    assert len(gains) == (norm == "instance_norm")  # a scale of ones (GroupNorm's, its affine follows) costs no Mul
    exact = module.reference(x)
    y = _run(rewritten, x)["y"]
    assert np.abs(y - exact).max() < EXACT_RELATIVE * np.abs(exact).max()

    # planted: the variance of x instead of the centred x (E[x^2], the channel means left in)
    planted = onnx.ModelProto()
    planted.CopyFrom(rewritten)
    squared = next(n for n in planted.graph.node if n.name.endswith("/gap_norm/squared"))
    squared.input[0] = next(n for n in planted.graph.node if n.name.endswith("/gap_norm/mean")).input[0]
    assert snr_db(exact, _run(planted, x)["y"]) < snr_db(exact, y) - 3 * WRONG_BY_DB


def test_instance_norm_of_rank_4():
    """An InstanceNorm2d's InstanceNormalization [N, C, H, W]: GAP pools H and W together."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(4)
    shape, scale, bias = (2, 3, 5, 7), rng.uniform(0.5, 2, 3), rng.uniform(-1, 1, 3)
    graph = helper.make_graph(
        [helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"], name="norm", epsilon=1e-3)],
        "rank_4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(v.astype(np.float32), name) for name, v in (("scale", scale), ("bias", bias))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert find_instance_norm(model) == ["norm"]
    x = (rng.standard_normal(shape) + 2.0).astype(np.float32)
    y = _run(instance_norm(model), x)["y"]
    exact = x.astype(np.float64)
    centred = exact - exact.mean(axis=(2, 3), keepdims=True)
    exact = centred / np.sqrt((centred**2).mean(axis=(2, 3), keepdims=True) + 1e-3) * scale[:, None, None] \
        + bias[:, None, None]
    assert np.abs(y - exact).max() < EXACT_RELATIVE * np.abs(exact).max()


def test_instance_norm_finds_nothing_without_one(x):
    model = _export(PlainSine(), x)
    assert find_instance_norm(model) == []
    with pytest.raises(ValueError, match="no InstanceNormalization"):
        instance_norm(model)


# --- weight_fold ------------------------------------------------------------------------------------------------

class WeightNormed(nn.Module):
    """Conv1d(4, C) -> ReLU -> Conv1d(C, C), both under torch.nn.utils.parametrizations.weight_norm."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        weight_norm = torch.nn.utils.parametrizations.weight_norm
        self.first = weight_norm(nn.Conv1d(4, CHANNELS, 3, padding=1))
        self.second = weight_norm(nn.Conv1d(CHANNELS, CHANNELS, 3, padding=1))

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))

    @staticmethod
    def weight(conv) -> np.ndarray:
        """float64 g * v / ||v|| (norm per output channel) from the two parameters."""
        g, v = (p.detach().numpy().astype(np.float64)
                for p in (conv.parametrizations.weight.original0, conv.parametrizations.weight.original1))
        return g * v / np.sqrt((v**2).sum(axis=(1, 2), keepdims=True))

    def reference(self, x):
        first = np.maximum(_conv1d(x, self.weight(self.first), self.first.bias.detach().numpy()), 0.0)
        return _conv1d(first, self.weight(self.second), self.second.bias.detach().numpy())


def test_weight_norm_folds_into_plain_weights(x):
    module = WeightNormed()
    model = _export(module, x, constant_folding=False)
    chains = [n.name for n in model.graph.node if n.op_type in ("ReduceL2", "Div", "Mul")]
    assert len(chains) == 6 and find_weight_fold(model) == chains
    folded = weight_fold(model)
    onnx.checker.check_model(folded, full_check=True)
    assert _ops(folded) == {"Conv", "Relu"} and find_weight_fold(folded) == []
    weights = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}
    convs = [n for n in folded.graph.node if n.op_type == "Conv"]
    for conv, torch_conv in zip(convs, (module.first, module.second)):
        assert weights[conv.input[1]].dtype == np.float32
        expected = module.weight(torch_conv)
        assert np.abs(weights[conv.input[1]] - expected).max() < EXACT_RELATIVE * np.abs(expected).max()
    exact = module.reference(x)
    y = _run(folded, x)["y"]
    assert np.abs(y - exact).max() < EXACT_RELATIVE * np.abs(exact).max()

    second = convs[1].input[1]  # planted: the second weight transposed (input and output channels swapped)
    transposed = _replace_initializer(folded, second, weights[second].transpose(1, 0, 2))
    assert snr_db(exact, _run(transposed, x)["y"]) < snr_db(exact, y) - 3 * WRONG_BY_DB


def test_weight_fold_reads_a_copied_constant_under_its_own_name():
    """An Identity of an initializer (a shared weight as exporters write it) is read from the initializer itself:
    no second copy is stored."""
    from onnx import TensorProto, helper

    weight = np.arange(6, dtype=np.float32).reshape(3, 2)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["w_copy"], name="copy"),
         helper.make_node("MatMul", ["x", "w_copy"], ["y"], name="matmul")], "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert find_weight_fold(model) == ["copy"]
    folded = weight_fold(model)
    assert [list(n.input) for n in folded.graph.node] == [["x", "w"]]
    assert [t.name for t in folded.graph.initializer] == ["w"]


def test_weight_fold_finds_nothing_without_a_constant_computation(x):
    """Constant nodes are constants already, and a random op of a constant draws anew on every call."""
    from onnx import TensorProto, helper

    model = _export(NormBetweenConvs("group_norm_8"), x)
    assert find_weight_fold(model) == []
    noise = helper.make_graph(
        [helper.make_node("RandomUniformLike", ["w"], ["noise"], name="draw"),
         helper.make_node("Add", ["x", "noise"], ["y"], name="add")], "noise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.zeros(2, np.float32), "w")])
    assert find_weight_fold(helper.make_model(noise, opset_imports=[helper.make_opsetid("", 17)])) == []
    with pytest.raises(ValueError, match="nothing for weight_fold"):
        weight_fold(model)


# --- input_phases -----------------------------------------------------------------------------------------------

SAMPLES = 2400  # divisible by every stride below


class WaveformFront(nn.Module):
    """Wav2Vec2's front end in miniature: [1, T] samples -> Unsqueeze -> Conv1d(1, C, K, stride P, no bias) -> ReLU
    -> Conv1d(C, C, 3, stride 2)."""

    def __init__(self, kernel: int, stride: int):
        super().__init__()
        torch.manual_seed(4)
        self.first = nn.Conv1d(1, CHANNELS, kernel, stride=stride, bias=False)
        self.second = nn.Conv1d(CHANNELS, CHANNELS, 3, stride=2)

    def forward(self, samples):
        return self.second(torch.relu(self.first(samples.unsqueeze(1))))

    def reference(self, samples: np.ndarray) -> np.ndarray:
        """float64 strided correlations on the [1, T] samples (one input channel)."""
        def strided(x, weight, stride):
            kernel = weight.shape[-1]
            frames = (x.shape[-1] - kernel) // stride + 1
            taps = np.stack([x[:, k:k + stride * (frames - 1) + 1:stride] for k in range(kernel)], axis=-1)
            return np.einsum("oik,itk->ot", weight.astype(np.float64), taps)

        first = strided(samples.astype(np.float64), self.first.weight.detach().numpy(), self.first.stride[0])
        second = strided(np.maximum(first, 0.0), self.second.weight.detach().numpy(), 2)
        return (second + self.second.bias.detach().numpy().astype(np.float64)[:, None])[None]


def _phases_run(model: onnx.ModelProto, samples: np.ndarray) -> np.ndarray:
    from rkaudio.board.shapes import in_phases
    from rkaudio.core.contract import contract_of

    with OnnxBackend(model, threads=1) as backend:
        return backend.run(in_phases(contract_of(model), {"x": samples}))["y"]


@pytest.mark.parametrize("kernel, stride", [(10, 5), (7, 3), (4, 4)])
def test_input_phases_feeds_the_waveform_in_phases(kernel, stride):
    from rkaudio.core.contract import contract_of
    from rkaudio.surgery.graph.input_phases import find_input_phases, input_phases

    module = WaveformFront(kernel, stride)
    samples = np.random.default_rng(5).standard_normal((1, SAMPLES)).astype(np.float32)
    model = _export(module, samples)
    first_conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert find_input_phases(model) == [first_conv.name]
    phased = input_phases(model)
    assert contract_of(phased).input_phases == {"x": stride}
    assert [d.dim_value for d in phased.graph.input[0].type.tensor_type.shape.dim] == [1, stride, SAMPLES // stride]
    assert "Unsqueeze" not in _ops(phased)
    reference = module.reference(samples)
    got = _phases_run(phased, samples)
    assert got.shape == reference.shape
    assert np.max(np.abs(got - reference)) / np.max(np.abs(reference)) < EXACT_RELATIVE


def test_input_phases_finds_nothing_it_cannot_split():
    from rkaudio.surgery.graph.input_phases import find_input_phases, input_phases

    samples = np.zeros((1, SAMPLES + 1), np.float32)  # 2401 samples: no whole phases of 5
    assert find_input_phases(_export(WaveformFront(10, 5), samples)) == []
    unstrided = _export(nn.Sequential(nn.Conv1d(4, CHANNELS, 3)), np.zeros((1, 4, SAMPLES), np.float32))
    assert find_input_phases(unstrided) == []
    assert input_phases(unstrided).graph == unstrided.graph


def test_input_phases_wrong_tap_order_misses_the_reference():
    from rkaudio.surgery.graph.input_phases import input_phases

    module = WaveformFront(10, 5)
    samples = np.random.default_rng(6).standard_normal((1, SAMPLES)).astype(np.float32)
    phased = input_phases(_export(module, samples))
    taps = next(t for t in phased.graph.initializer if t.name.endswith("/phase_taps"))
    weight = numpy_helper.to_array(taps)  # [C, P, ceil(K/P)]: a slip laying the taps out phase-major
    planted = _replace_initializer(phased, taps.name, weight.reshape(weight.shape[0], -1)
                                   .reshape(weight.shape[0], weight.shape[2], weight.shape[1]).transpose(0, 2, 1))
    reference = module.reference(samples)
    assert snr_db(reference, _phases_run(phased, samples)) > 120.0
    assert snr_db(reference, _phases_run(planted, samples)) < 120.0 - WRONG_BY_DB


def test_in_phases_puts_sample_p_j_at_phase_p():
    from rkaudio.board.contract import EngineContract
    from rkaudio.board.shapes import ShapeRefused, in_phases

    contract = EngineContract(input_phases={"audio": 4})
    samples = np.arange(12, dtype=np.float32)[None]
    fed = in_phases(contract, {"audio": samples, "other": samples})
    assert fed["audio"].shape == (1, 4, 3) and fed["audio"][0, 1, 2] == 4 * 2 + 1
    assert fed["other"] is samples
    assert in_phases(contract, {"audio": fed["audio"]})["audio"] is fed["audio"]  # already split: as given
    with pytest.raises(ShapeRefused, match="do not split into 4 phases"):
        in_phases(contract, {"audio": np.zeros((1, 10), np.float32)})
