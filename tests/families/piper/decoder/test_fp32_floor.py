"""The decoder's window gates follow the voice's own fp32 floor (rkaudio.gates.fp32_floor) where it is under their fixed
levels: joe's weights edited so its fp32 decode sits 74-89 dB from float64 (joe itself: 110-121 dB;
tests/low_floor.offset_flow) export with every gate passing at the lowered thresholds, and the planted faults of
test_planted_faults (a context the flow does not cover, one padded frame marked real) still fail in that same
export."""
from __future__ import annotations

import shutil

import onnx
import pytest

from rkaudio.board.piper import PiperWindow
from rkaudio.families.piper import FAMILY, decoder
from rkaudio.core.manifest import engine_contract
from rkaudio.gates.walk_vs_full import WalkBesideFull
from rkaudio.host.backends import OnnxBackend
from tests.low_floor import offset_flow

pytestmark = pytest.mark.slow  # joe's weights, edited

OFFSET = 300.0  # measured floors 73.9 (voice latent), 75.1 (white noise), 88.6 dB (short latent)
COUPLINGS = ("flow.flows.6", "flow.flows.4", "flow.flows.2")  # the reverse flow runs 6, 4, 2, 0
WINDOW, CONTEXT = 109, 32


@pytest.fixture(scope="module")
def low_floor_voice(joe, tmp_path_factory):
    path = tmp_path_factory.mktemp("low_floor") / "joe-low-floor.onnx"
    onnx.save(offset_flow(joe.model, OFFSET, COUPLINGS), str(path))
    shutil.copy(f"{joe.voice.onnx_path}.json", f"{path}.json")
    return path


@pytest.fixture(scope="module")
def low_floor_export(low_floor_voice):
    return decoder.export(FAMILY.job("decoder", target="rk3588", out=low_floor_voice.parent,
                                     source={"voice_onnx": low_floor_voice},
                                     options={"window": WINDOW, "context": CONTEXT}))[0]


def test_low_floor_voice_exports_with_its_window_gates_held_to_the_floor(low_floor_export):
    windows = [v for v in low_floor_export.verdicts if "window" in v.name or "global" in v.name]
    print("\n" + "\n".join(v.line() for v in low_floor_export.verdicts))
    assert all(v.passed for v in low_floor_export.verdicts), [v.line() for v in low_floor_export.verdicts]
    interior = [v for v in windows if "interior" in v.name or "global" in v.name]
    padded = [v for v in windows if "padded" in v.name]
    assert len(interior) == 4 and len(padded) == 1
    # Every floor is under its old fixed level, so these thresholds are the floor's, not the fixed ones.
    assert all(v.threshold < decoder.MIN_INTERIOR_DB - 5 for v in interior), [v.line() for v in interior]
    assert padded[0].threshold < decoder.MIN_PADDED_DB - 5, padded[0].line()


def test_planted_faults_still_fail_the_low_floor_export(low_floor_voice, low_floor_export):
    from rkaudio.families.piper.voice import load_voice
    from tests.families.piper.decoder.test_planted_faults import OnePaddedFrameReal

    voice, model = load_voice(low_floor_voice)
    piece = decoder.slice_voice(model)
    latents = decoder.voice_latents(model, piece.seam, voice.config)
    # A context of 16 slices: the flow reaches ~32 (joe: 16.4 dB worst window).
    short_context, window = decoder.fixed_window_model(piece, WINDOW, 16, False, "low-floor", 22050)
    verdicts = decoder.selfcheck(short_context, window, piece, latents, noise_length=3 * WINDOW + WINDOW // 2)
    interior = [v for v in verdicts if "worst interior" in v.name]
    assert interior and not any(v.passed for v in interior), [v.line() for v in interior]
    assert all(v.value < v.threshold - 10 for v in interior), [v.line() for v in interior]
    # One padded frame marked real, in the export that passed above, at its own floor.
    window = PiperWindow.of(engine_contract(low_floor_export.onnx))
    z = decoder.short_latent(latents[0], window.window)
    full = OnnxBackend(piece.model, threads=1)
    reference = decoder.full_decode(full, z, None)
    floor = decoder.decode_floor(piece.model, z, None, reference)
    runner = OnnxBackend(low_floor_export.onnx, threads=1)
    good = decoder.padded_verdict("real", WalkBesideFull.run(runner, z, window, reference), False, floor)
    bad = decoder.padded_verdict("planted", WalkBesideFull.run(OnePaddedFrameReal(runner), z, window, reference),
                                 False, floor)
    assert good.passed and good.threshold < decoder.MIN_PADDED_DB, good.line()
    assert not bad.passed and bad.value < bad.threshold - 20, bad.line()
