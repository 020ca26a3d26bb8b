"""On joe: the decoder-half mask lifts short tails, leaves interiors byte-identical, and the known-bad variants
(mask 1 over padding, Resize upsampler) fail; the export records the window contract, and the polyphase tail is
the same map (the passes themselves: tests/surgery/test_mask.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from rkaudio.board.piper import PiperWindow
from rkaudio.families.piper import decoder
from rkaudio.gates import opscan
from rkaudio.gates.walk_vs_full import WalkBesideFull
from rkaudio.host.backends import OnnxBackend
from rkaudio.core.contract import contract_of, get_contract
from rkaudio.surgery.graph.polyphase_levels import overflowing_levels


class MaskOfOnes:
    """A known-bad runtime: marks the padding as real (mask 1 everywhere)."""

    def __init__(self, inner):
        self.inner = inner

    def run(self, feeds):
        return self.inner.run({**feeds, decoder.MASK: np.ones_like(feeds[decoder.MASK])})


def _walk(joe, export, z, backend_wrapper=None) -> WalkBesideFull:
    """`z` walked over the exported engine (through `backend_wrapper` when given), beside joe's full decode of it."""
    runner = OnnxBackend(export.onnx, threads=1)
    window = PiperWindow.of(contract_of(export.onnx))
    return WalkBesideFull.run(backend_wrapper(runner) if backend_wrapper else runner, z, window,
                              decoder.full_decode(joe.full, z, None))


@pytest.mark.slow
def test_dec_mask_lifts_a_47_slice_tail_and_leaves_interiors_unchanged(joe, joe_exports):
    z = decoder.short_latent(joe.latents[0], 109, 47)
    plain, masked = _walk(joe, joe_exports[False], z), _walk(joe, joe_exports[True], z)
    plain_db, masked_db = plain.global_snr(), masked.global_snr()
    assert masked_db > 100.0 and plain_db < 60.0, (plain_db, masked_db)
    assert decoder.padded_verdict("47", plain, dec_mask=False).passed
    assert decoder.padded_verdict("47", masked, dec_mask=True).passed
    long = joe.latents[0]["z"]
    np.testing.assert_array_equal(_walk(joe, joe_exports[False], long).output,
                                  _walk(joe, joe_exports[True], long).output)


@pytest.mark.slow
@pytest.mark.parametrize("dec_mask", [False, True])
def test_mask_of_one_over_padding_is_caught(joe, joe_exports, dec_mask):
    z = decoder.short_latent(joe.latents[0], 109, 47)
    verdict = decoder.padded_verdict("mask 1 over padding", _walk(joe, joe_exports[dec_mask], z, MaskOfOnes), dec_mask)
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
    # one speaker, no level in polyphase form: present as null, as every published contract holds them
    assert (contract["polyphase"], contract["cond_input"], contract["cond_channels"]) == (None, None, None)
    for export in joe_exports.values():  # the real default exports pass every raised threshold
        assert all(v.passed for v in export.verdicts), [v.line() for v in export.verdicts]


@pytest.mark.slow
def test_polyphase_joe_engine_is_the_same_map(joe):
    plain, window = decoder.fixed_window_model(joe.piece, 93, 24, False, "joe", 22050)
    phased, phased_window = decoder.fixed_window_model(joe.piece, 93, 24, False, "joe", 22050, target="rk3576")
    assert (window.polyphase, phased_window.polyphase) == (None, 4)
    feeds = {decoder.LATENT: joe.latents[0]["z"][:, :, :93], decoder.MASK: np.ones((1, 1, 93), np.float32)}
    from rkaudio.board.numeric import snr_db

    assert snr_db(OnnxBackend(plain, threads=1).run(feeds)["output"],
                  OnnxBackend(phased, threads=1).run(feeds)["output"]) > 120.0
    strides = joe.piece.strides  # [8, 8, 4]: 93 slices are 744 / 5,952 / 23,808 samples at its three levels
    assert overflowing_levels("rk3566", 93, strides) == 1 and overflowing_levels("rk3576", 93, strides) == 1
    assert overflowing_levels("rk3588", 93, strides) == 0 and overflowing_levels("rk3566", 31, strides) == 0
