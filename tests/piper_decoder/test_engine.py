"""The joe decoder engine for rk3588: 0 REGTASK lines, 0 CPU compute ops, simulator >= 35 dB; the
runtime refuses an engine built for another voice."""
from __future__ import annotations

import numpy as np
import pytest

from converters.engine import BuildOptions, build_engine
from converters.families.piper import decoder
from converters.toolkit import SetupError


def test_joe_engine_builds_clean_for_rk3588(joe_exports, tmp_path, require_converter):
    require_converter("2.3.2")
    export = joe_exports[False]
    options = BuildOptions(target="rk3588", toolkit="2.3.2", max_regtask_lines=0, fail_on_cpu_ops=True,
                           min_simulator_snr_db=35.0)
    result = build_engine(export.onnx_path, tmp_path, options, selfcheck=export.selfcheck_path,
                          export_verdicts=export.verdicts)
    gates = {v.name: v for v in result.verdicts}
    assert gates["regtask_lines"].value == 0 and gates["cpu_compute_ops"].value == 0
    assert gates["simulator_snr[output]"].value >= 35.0
    plan = result.manifest_data["exec_plan"]
    assert plan == {"piper_tts.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {"main": result.rknn.name}}}}
    contract = decoder.engine_contract(result.rknn)
    assert contract["latent_channels"] == 192 and contract["hop"] == 256 and contract["sample_rate"] == 22050


def test_runtime_refuses_an_engine_of_another_voice(joe_exports):
    contract = decoder.engine_contract(joe_exports[False].onnx_path)
    runner = decoder.OrtRunner(joe_exports[False].onnx_path)
    decoder.VoiceDecoder(runner, contract, voice_channels=192)
    with pytest.raises(SetupError, match=r"192-channel latent but this voice has 16.*produced by: .*convert piper --voice-onnx"):
        decoder.VoiceDecoder(runner, contract, voice_channels=16)
