"""Decoder-half mask injection and the polyphase last level: exact against a float64 numpy reference; on
joe the mask fixes short tails, leaves interiors byte-identical, and the known-bad variants (mask 1 over
padding, Resize upsampler) fail."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.families.piper import decoder
from rkaudio.gates import opscan
from rkaudio.host.backends import OnnxBackend
from rkaudio.board.window_walk import WindowContract, walk
from rkaudio.surgery.graph.mask import level_strides, mask_decoder
from rkaudio.core.contract import get_contract
from rkaudio.surgery.graph.polyphase_levels import overflowing_levels, polyphase_levels


def conv1d(x, w, b, pad, dilation=1):
    """float64 reference: x [C_in, T], w [C_out, C_in, K], 'same' padding."""
    xp = np.pad(x, ((0, 0), (pad, pad)))
    length = x.shape[1]
    out = sum(np.einsum("oc,ct->ot", w[:, :, j], xp[:, j * dilation : j * dilation + length]) for j in range(w.shape[2]))
    return out + b[:, None]


def conv_transpose1d(x, w, b, stride, pad):
    """float64 reference: w [C_in, C_out, K]; output length (T-1)*stride + K - 2*pad."""
    c_in, c_out, k = w.shape
    full = np.zeros((c_out, (x.shape[1] - 1) * stride + k))
    for t in range(x.shape[1]):
        full[:, t * stride : t * stride + k] += np.einsum("c,cok->ok", x[:, t], w)
    return full[:, pad : full.shape[1] - pad] + b[:, None]


def tiny_decoder(rng):
    """x [1,3,N] -> Conv -> LeakyRelu -> ConvT(s2) -> Conv -> ConvT(s3) -> Conv(dilation 2) -> Tanh -> Conv -> y
    (a 2-level HiFi-GAN shape)."""
    p = {"w0": rng.standard_normal((4, 3, 3)), "b0": rng.standard_normal(4),
         "u1": rng.standard_normal((4, 3, 4)), "c1": rng.standard_normal(3),
         "w2": rng.standard_normal((3, 3, 3)), "b2": rng.standard_normal(3),
         "u3": rng.standard_normal((3, 2, 3)), "c3": rng.standard_normal(2),
         "w4": rng.standard_normal((2, 2, 3)), "b4": rng.standard_normal(2),
         "w5": rng.standard_normal((1, 2, 3)), "b5": rng.standard_normal(1)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["h0"], pads=[1, 1]),
             helper.make_node("LeakyRelu", ["h0"], ["a0"], alpha=0.1),
             helper.make_node("ConvTranspose", ["a0", "u1", "c1"], ["h1"], strides=[2], pads=[1, 1]),
             helper.make_node("Conv", ["h1", "w2", "b2"], ["h2"], pads=[1, 1]),
             helper.make_node("ConvTranspose", ["h2", "u3", "c3"], ["h3"], strides=[3]),
             helper.make_node("Conv", ["h3", "w4", "b4"], ["h4"], pads=[2, 2], dilations=[2]),
             helper.make_node("Tanh", ["h4"], ["a4"]),
             helper.make_node("Conv", ["a4", "w5", "b5"], ["y"], pads=[1, 1])]
    graph = helper.make_graph(nodes, "dec", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, None]),
                                             helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in p.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), p


def reference(p, x, m):
    """Masked decoder in float64: every conv output times the mask repeated to its level's length."""
    m1, m2 = np.repeat(m, 2), np.repeat(m, 6)
    h = conv1d(x, p["w0"], p["b0"], 1) * m
    h = np.where(h > 0, h, 0.1 * h)
    h = conv_transpose1d(h, p["u1"], p["c1"], 2, 1) * m1
    h = conv1d(h, p["w2"], p["b2"], 1) * m1
    h = conv_transpose1d(h, p["u3"], p["c3"], 3, 0) * m2
    h = np.tanh(conv1d(h, p["w4"], p["b4"], 2, dilation=2) * m2)
    return conv1d(h, p["w5"], p["b5"], 1) * m2


def test_mask_decoder_and_polyphase_match_float64_reference():
    rng = np.random.default_rng(0)
    model, params = tiny_decoder(rng)
    assert level_strides(model, "x") == [2, 3]
    masked = mask_decoder(model, "x", "m")
    x = rng.standard_normal((1, 3, 11))
    m = np.ones((1, 1, 11))
    m[..., 7:] = 0.0
    got = OnnxBackend(masked, threads=1).run({"x": x.astype(np.float32), "m": m.astype(np.float32)})["y"]
    want = reference(params, x[0], m[0, 0])
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-4)
    assert np.all(got[0, :, 7 * 6 :] == 0.0)  # the padding stays exactly zero at the output rate
    # The polyphase last level (phases of the stride-3 ConvTranspose stacked on channels) is the same map.
    phased = polyphase_levels(masked, "x", 1)
    assert {n.op_type for n in phased.graph.node if n.output[0] == "h3_unmasked"} == {"Conv"}
    got = OnnxBackend(phased, threads=1).run({"x": x.astype(np.float32), "m": m.astype(np.float32)})["y"]
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-4)
    # With the mask all ones the pass changes nothing.
    ones = {"x": x.astype(np.float32), "m": np.ones((1, 1, 11), np.float32)}
    plain, ones = OnnxBackend(model, threads=1).run(ones)["y"], OnnxBackend(masked, threads=1).run(ones)["y"]
    np.testing.assert_array_equal(plain, ones)


class MaskOfOnes:
    """A known-bad runtime: marks the padding as real (mask 1 everywhere)."""

    def __init__(self, inner):
        self.inner = inner

    def run(self, feeds):
        return self.inner.run({**feeds, decoder.MASK: np.ones_like(feeds[decoder.MASK])})


def _walk(export, z, backend_wrapper=None):
    runner = OnnxBackend(export.onnx, threads=1)
    contract = WindowContract.from_contract(get_contract(export.onnx))
    return walk(backend_wrapper(runner) if backend_wrapper else runner, z, contract)


@pytest.mark.slow
def test_dec_mask_lifts_a_47_slice_tail_and_leaves_interiors_unchanged(joe, joe_exports):
    z = decoder.short_latent(joe.latents[0], 109, 47)
    reference = decoder.full_decode(joe.full, z, None)
    plain, masked = _walk(joe_exports[False], z), _walk(joe_exports[True], z)
    from rkaudio.board.numeric import snr_db

    plain_db, masked_db = snr_db(reference, plain.output), snr_db(reference, masked.output)
    assert masked_db > 100.0 and plain_db < 60.0, (plain_db, masked_db)
    assert decoder.padded_verdict("47", reference, plain, dec_mask=False).passed
    assert decoder.padded_verdict("47", reference, masked, dec_mask=True).passed
    long = joe.latents[0]["z"]
    np.testing.assert_array_equal(_walk(joe_exports[False], long).output, _walk(joe_exports[True], long).output)


@pytest.mark.slow
@pytest.mark.parametrize("dec_mask", [False, True])
def test_mask_of_one_over_padding_is_caught(joe, joe_exports, dec_mask):
    z = decoder.short_latent(joe.latents[0], 109, 47)
    reference = decoder.full_decode(joe.full, z, None)
    bad = _walk(joe_exports[dec_mask], z, MaskOfOnes)
    verdict = decoder.padded_verdict("mask 1 over padding", reference, bad, dec_mask)
    assert not verdict.passed, verdict.line()


def _resize_upsampled(model: onnx.ModelProto) -> onnx.ModelProto:
    """The known-bad variant: the mask brought to each level by Resize(nearest) instead of ConvTranspose."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        if node.op_type == "ConvTranspose" and node.input[0].startswith(decoder.MASK):
            stride = next(a.ints[0] for a in node.attribute if a.name == "strides")
            scales = f"{node.output[0]}_scales"
            out.graph.initializer.append(numpy_helper.from_array(np.array([1, 1, stride], np.float32), scales))
            node.op_type = "Resize"
            node.input[:] = [node.input[0], "", scales]
            del node.attribute[:]
            node.attribute.append(helper.make_attribute("mode", "nearest"))
    return out


@pytest.mark.slow
def test_resize_mask_upsampler_is_caught(joe_exports):
    model = onnx.load(str(joe_exports[True].onnx))
    assert opscan.verdict(opscan.scan(model, "rk3588")).passed
    bad = _resize_upsampled(model)
    assert sum(n.op_type == "Resize" for n in bad.graph.node) == 3
    # Numerically it is the same upsampling in onnxruntime: only the problem-op gate can see it.
    feeds = {decoder.LATENT: np.random.default_rng(0).standard_normal((1, 192, 109)).astype(np.float32),
             decoder.MASK: np.ones((1, 1, 109), np.float32)}
    np.testing.assert_array_equal(OnnxBackend(model, threads=1).run(feeds)["output"],
                                  OnnxBackend(bad, threads=1).run(feeds)["output"])
    verdict = opscan.verdict(opscan.scan(bad, "rk3588"))
    assert not verdict.passed and "Resize" in verdict.detail


@pytest.mark.slow
def test_export_records_the_window_contract(joe_exports):
    contract = get_contract(joe_exports[True].onnx)
    assert (contract["window"], contract["context"], contract["emitted"], contract["hop"]) == (109, 32, 45, 256)
    assert contract["latent_channels"] == 192 and contract["strides"] == [8, 8, 4]
    assert contract["sample_rate"] == 22050 and contract["dec_mask"] is True
    for export in joe_exports.values():  # the real default exports pass every raised threshold
        assert all(v.passed for v in export.verdicts), [v.line() for v in export.verdicts]


@pytest.mark.slow
def test_polyphase_joe_engine_is_the_same_map(joe):
    plain = decoder.fixed_window_model(joe.piece, 93, 24, False, "joe", 22050)
    phased = decoder.fixed_window_model(joe.piece, 93, 24, False, "joe", 22050, phase_levels=1)
    assert get_contract(phased)["polyphase"] == 4
    feeds = {decoder.LATENT: joe.latents[0]["z"][:, :, :93], decoder.MASK: np.ones((1, 1, 93), np.float32)}
    from rkaudio.board.numeric import snr_db

    assert snr_db(OnnxBackend(plain, threads=1).run(feeds)["output"],
                  OnnxBackend(phased, threads=1).run(feeds)["output"]) > 120.0
    strides = joe.piece.strides  # [8, 8, 4]: 93 slices are 744 / 5,952 / 23,808 samples at its three levels
    assert overflowing_levels("rk3566", 93, strides) == 1 and overflowing_levels("rk3576", 93, strides) == 1
    assert overflowing_levels("rk3588", 93, strides) == 0 and overflowing_levels("rk3566", 31, strides) == 0
