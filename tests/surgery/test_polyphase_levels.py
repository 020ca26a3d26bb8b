"""polyphase_levels (the last upsampling levels run as phases stacked on channels, nested level by level) against a
float64 numpy decoder written from the definitions of its ops, with the decoder mask; a planted off-by-one phase
fails the same comparison; overflowing_levels counts the levels past each target's time field."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.board.contract import EngineContract
from rkaudio.board.vits import VitsWindow
from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph import polyphase_levels as pl
from rkaudio.surgery.graph.mask import level_strides, mask_decoder

STRIDES = (2, 3, 2)
LENGTH = 9


def conv(x, w, b, pads, dilation=1):
    """x [Cin, T], w [Cout, Cin, K]: out[t] = sum_j w[:, :, j] x[t + j*d - pads[0]], zeros outside x."""
    padded = np.pad(x, ((0, 0), tuple(pads)))
    length = padded.shape[1] - dilation * (w.shape[2] - 1)
    return sum(w[:, :, j] @ padded[:, j * dilation : j * dilation + length] for j in range(w.shape[2])) + b[:, None]


def conv_transpose(x, w, b, stride, pad):
    """x [Cin, T], w [Cin, Cout, K]: input t scatters w[:, :, k] to output t*stride + k - pad, cropped."""
    full = np.zeros((w.shape[1], (x.shape[1] - 1) * stride + w.shape[2]))
    for t in range(x.shape[1]):
        full[:, t * stride : t * stride + w.shape[2]] += np.einsum("c,cok->ok", x[:, t], w)
    return full[:, pad : full.shape[1] - pad] + b[:, None]


def leaky(x):
    return np.where(x > 0, x, 0.1 * x)


def three_level_decoder(rng):
    """x [1,4,N] -> Conv -> LeakyRelu -> ConvT(s2) -> residual dilated Conv -> LeakyRelu -> ConvT(s3) -> Conv
    (dilation 3) -> Div 2 -> ConvT(s2) -> Conv -> Tanh -> y: a 3-level HiFi-GAN shape."""
    p = {"w0": (5, 4, 3), "u1": (5, 4, 4), "w1": (4, 4, 3), "u2": (4, 3, 3), "w2": (3, 3, 5), "u3": (3, 2, 6),
         "w3": (1, 2, 3)}
    p = {k: rng.standard_normal(shape) for k, shape in p.items()}
    p.update({f"{k}_b": rng.standard_normal(v.shape[1] if k.startswith("u") else v.shape[0]) for k, v in list(p.items())})
    nodes = [helper.make_node("Conv", ["x", "w0", "w0_b"], ["h0"], pads=[1, 1]),
             helper.make_node("LeakyRelu", ["h0"], ["a0"], alpha=0.1),
             helper.make_node("ConvTranspose", ["a0", "u1", "u1_b"], ["h1"], strides=[2], pads=[1, 1]),
             helper.make_node("Conv", ["h1", "w1", "w1_b"], ["r1"], pads=[2, 2], dilations=[2]),
             helper.make_node("Add", ["h1", "r1"], ["s1"]),
             helper.make_node("LeakyRelu", ["s1"], ["a1"], alpha=0.1),
             helper.make_node("ConvTranspose", ["a1", "u2", "u2_b"], ["h2"], strides=[3]),
             helper.make_node("Conv", ["h2", "w2", "w2_b"], ["r2"], pads=[6, 6], dilations=[3]),
             helper.make_node("Div", ["r2", "two"], ["d2"]),
             helper.make_node("ConvTranspose", ["d2", "u3", "u3_b"], ["h3"], strides=[2], pads=[2, 2]),
             helper.make_node("Conv", ["h3", "w3", "w3_b"], ["r3"], pads=[1, 1]),
             helper.make_node("Tanh", ["r3"], ["y"])]
    weights = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in p.items()]
    weights.append(numpy_helper.from_array(np.array(2.0, np.float32), "two"))
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, None]),
                                                                 helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return mask_decoder(model, "x", "m"), p


def reference(p, x, m):
    """The masked decoder in float64: every conv output times the mask repeated to its level's length."""
    m1, m2, m3 = (np.repeat(m, int(np.prod(STRIDES[: k + 1]))) for k in range(3))
    h = leaky(conv(x, p["w0"], p["w0_b"], (1, 1)) * m)
    h = conv_transpose(h, p["u1"], p["u1_b"], 2, 1) * m1
    h = leaky(h + conv(h, p["w1"], p["w1_b"], (2, 2), dilation=2) * m1)
    h = conv_transpose(h, p["u2"], p["u2_b"], 3, 0) * m2
    h = conv(h, p["w2"], p["w2_b"], (6, 6), dilation=3) * m2 / 2.0
    h = conv_transpose(h, p["u3"], p["u3_b"], 2, 2) * m3
    return np.tanh(conv(h, p["w3"], p["w3_b"], (1, 1)) * m3)


def assert_polyphase_is_exact(levels: int):
    """The pass at `levels` levels against the float64 reference, a short latent's padding masked off."""
    rng = np.random.default_rng(levels)
    model, params = three_level_decoder(rng)
    assert level_strides(model, "x") == list(STRIDES)
    phased = pl.polyphase_levels(model, "x", levels)
    upsamplers = [f"h{k}_unmasked" for k in range(4 - levels, 4)]  # mask_decoder's names of the levels' outputs
    assert {n.op_type for n in phased.graph.node if n.output[0] in upsamplers} == {"Conv"}
    x = rng.standard_normal((1, 4, LENGTH))
    m = np.ones((1, 1, LENGTH))
    m[..., 6:] = 0.0
    got = OnnxBackend(phased, threads=1).run({"x": x.astype(np.float32), "m": m.astype(np.float32)})["y"]
    np.testing.assert_allclose(got[0], reference(params, x[0], m[0, 0]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("levels", [1, 2, 3])
def test_polyphase_levels_match_float64_reference(levels):
    assert_polyphase_is_exact(levels)


def test_off_by_one_phase_fails_the_reference(monkeypatch):
    """A planted fault: every tap reads the next phase of its sample. The comparison above must catch it."""
    monkeypatch.setattr(pl, "source_phase", lambda offset, phases: ((offset + 1) % phases, offset // phases))
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        assert_polyphase_is_exact(2)


def test_too_many_levels_is_refused():
    model, _ = three_level_decoder(np.random.default_rng(0))
    with pytest.raises(pl.PolyphaseError, match="4 polyphase levels asked"):
        pl.polyphase_levels(model, "x", 4)


def test_overflowing_levels_per_target():
    inflect, piper = [8, 8, 2, 2], [8, 8, 4]
    # Inflect at 256 slices: 2,048 / 16,384 / 32,768 / 65,536 samples; rk3576 holds 16,383, rk3566 8,191.
    assert [pl.overflowing_levels(t, 256, inflect) for t in ("rk3588", "rk3576", "rk3566")] == [0, 3, 3]
    assert [pl.overflowing_levels(t, 128, inflect) for t in ("rk3588", "rk3576", "rk3566")] == [0, 2, 3]
    assert [pl.overflowing_levels(t, 127, piper) for t in ("rk3588", "rk3576", "rk3566")] == [0, 1, 1]
    assert pl.phase_count(inflect, 3) == 32 and pl.phase_count(inflect, 0) == 1


def test_lacks_phases_of_an_export_for_a_wider_field():
    window = VitsWindow.two_sided(256, 32, hop=256, latent_input="z", output="audio", strides=[8, 8, 2, 2])
    contract = EngineContract(family="inflect").with_fields(**window.to_fields())
    assert not pl.lacks_phases(contract, "rk3588") and pl.lacks_phases(contract, "rk3566")
    assert not pl.lacks_phases(contract.with_fields(polyphase=32), "rk3566")
    assert pl.lacks_phases(contract.with_fields(polyphase=4), "rk3576")  # two levels where three overflow
    assert not pl.lacks_phases(EngineContract(), "rk3566")  # no VITS window: a foreign ONNX's contract


def test_interleave_stages_keep_the_widest_last_and_within_bounds():
    assert pl.interleave_stages(32) == [4, 8] and pl.interleave_stages(4) == [4] and pl.interleave_stages(1) == []
    assert pl.interleave_stages(12) == [2, 6] and pl.interleave_stages(64) == [8, 8] and pl.interleave_stages(11) == [11]
