"""The fixed-window slice: cut at the latent, flips folded, decoder-half mask, folded at the window;
windowed decode against a full-length decode.onnx decode (tails with and without the mask, interiors); the leading
upsamplers in stride-phase form against the native ones in float64."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from rkaudio.families.inflect import MIN_INTERIOR_DB
from rkaudio.families.inflect.decoder import TAIL_LENGTHS, selfcheck_verdicts
from rkaudio.gates import opscan
from rkaudio.surgery.graph.fold import op_histogram
from rkaudio.core.contract import get_contract, set_contract
from rkaudio.core.errors import SetupError


def _dims(value):
    return [d.dim_value for d in value.type.tensor_type.shape.dim]


def test_folded_slice_has_only_latent_and_mask_inputs_and_no_problem_ops(official, slices):
    cfg, _ = official
    path, verdicts = slices[True].onnx, slices[True].verdicts
    model = onnx.load(str(path))
    assert [(i.name, _dims(i)) for i in model.graph.input] == [("z", [1, cfg.inter_channels, 256]),
                                                               ("y_mask", [1, 1, 256])]
    assert [(o.name, _dims(o)) for o in model.graph.output] == [("waveform", [1, 1, 256 * cfg.hop_length])]
    ops = op_histogram(model)
    assert "Shape" not in ops and "ConstantOfShape" not in ops and "Exp" not in ops  # no noise head
    assert opscan.scan(model, "rk3588") == [] and all(v.passed for v in verdicts)
    contract = get_contract(model)
    assert contract["nodes_after_fold"] < contract["nodes_before_fold"]
    assert (contract["latent_channels"], contract["hop"], contract["window"], contract["context"],
            contract["emitted"]) == (cfg.inter_channels, cfg.hop_length, 256, 32, 192)
    assert contract["exec_plan_option"] == "inflect_v2.exec_plan" and contract["component"] == "decoder"


def _tampered(path, tmp_path, **changes):
    """The same slice with its contract edited: a known-bad artifact for a gate."""
    model = onnx.load(str(path))
    model = set_contract(model, {**get_contract(model), **changes})
    out = tmp_path / path.name
    onnx.save(model, str(out))
    return out


def _figures(verdicts) -> dict[str, float]:
    return {v.name: v.value for v in verdicts}


def test_tails_need_the_decoder_half_mask_and_interiors_are_unchanged(official, slices, tmp_path):
    """Gated self-check on the masked slice passes; the unmasked slice, claiming a mask (a known-bad
    artifact), fails every tail gate by a wide margin while its interior window is bit-identical."""
    cfg, paths = official
    masked = selfcheck_verdicts(slices[True].onnx, paths["decode"], paths["duration"], say=lambda *_: None)
    claims_masked = _tampered(slices[False].onnx, tmp_path, dec_mask=True)
    unmasked = selfcheck_verdicts(claims_masked, paths["decode"], paths["duration"], say=lambda *_: None)
    tails = [f"tail_snr[{n}]" for n in TAIL_LENGTHS]
    assert [v.name for v in masked] == tails + ["interior_snr_min"] and all(v.passed for v in masked)
    assert [v.name for v in unmasked if not v.passed] == tails
    with_mask, without = _figures(masked), _figures(unmasked)
    print(f"{cfg.name} tail/interior dB with mask {with_mask}, without {without}")
    assert all(with_mask[t] - without[t] > 20.0 for t in tails)
    assert with_mask["interior_snr_min"] >= MIN_INTERIOR_DB
    assert with_mask["interior_snr_min"] == without["interior_snr_min"]


def test_interior_gate_fails_without_context(nano_official, nano_slice, tmp_path):
    _, paths = nano_official
    no_context = _tampered(nano_slice, tmp_path, context=0, emitted=256)
    verdicts = selfcheck_verdicts(no_context, paths["decode"], paths["duration"], say=lambda *_: None)
    assert [v.name for v in verdicts if not v.passed] == ["interior_snr_min"]


def test_selfcheck_degrades_without_decode_onnx(nano_official, nano_slice):
    said = []
    degraded = selfcheck_verdicts(nano_slice, None, nano_official[1]["duration"], say=said.append)
    assert [v.name for v in degraded] == ["window_self_snr"] and degraded[0].passed
    assert "degrades to one window-length latent decoded against itself" in said[0]


STRIDE_PHASE_WINDOW = 64  # 4,096 samples at the second level: rk3566 runs the last two of its four in polyphase form


def _slice_at(paths, target: str, stride_phase_levels: int):
    """The masked Nano slice at a short window (float64 runs are slow) for `target`, `stride_phase_levels` leading
    upsamplers in stride-phase form: (its graph, its window contract)."""
    from rkaudio.families.inflect.decoder import describe, slice_decoder

    model, info = describe(paths["decode"], None)
    return slice_decoder(model, info, STRIDE_PHASE_WINDOW, 16, True, target, stride_phase_levels)


@pytest.mark.parametrize("target, levels", [("rk3588", 4), ("rk3566", 2)])
def test_stride_phase_levels_match_the_native_transposed_convolutions_in_float64(nano_official, target, levels):
    """Every level the target's polyphase form leaves as a stride-phase Conv and an interleave, against the native
    ConvTransposes, both run in float64 by the onnx reference evaluator (its ConvTranspose written from the
    definition) on a latent whose last slices are padding (mask 0): the rewrite only rearranges weights, so they
    agree to float64 rounding; the contract says how many levels."""
    from rkaudio.gates.fp32_floor import float64_run

    _, paths = nano_official
    (native, native_window), (rewritten, window) = _slice_at(paths, target, 0), _slice_at(paths, target, levels)
    assert op_histogram(native)["ConvTranspose"] - op_histogram(rewritten).get("ConvTranspose", 0) == levels
    assert window.stride_phase_levels == levels and window.polyphase == native_window.polyphase
    rng = np.random.default_rng(levels)
    mask = (np.arange(STRIDE_PHASE_WINDOW) < 50).astype(np.float32)[None, None]
    feeds = {"z": rng.standard_normal((1, 128, STRIDE_PHASE_WINDOW)).astype(np.float32) * mask, "y_mask": mask}
    expected = float64_run(native, feeds)["waveform"]
    got = float64_run(rewritten, feeds)["waveform"]
    assert np.max(np.abs(expected)) > 0.01
    assert np.max(np.abs(got - expected)) < 1e-9 * np.max(np.abs(expected))


def test_stride_phase_levels_overlapping_the_polyphase_levels_are_refused(nano_official):
    with pytest.raises(SetupError, match="3 stride-phase and 2 polyphase levels overlap"):
        _slice_at(nano_official[1], "rk3566", 3)
