"""The joe decoder engine for rk3588: 0 REGTASK lines, 0 CPU compute ops, simulator >= 35 dB; the
runtime refuses an engine built for another voice."""
from __future__ import annotations

import pytest

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.core.errors import SetupError
from rkaudio.host.backends import OnnxBackend
from rkaudio.board.piper import PiperWindow, VoiceDecoder
from rkaudio.core.manifest import engine_contract


@pytest.mark.slow
def test_joe_engine_builds_clean_for_rk3588(joe_exports, tmp_path, require_converter):
    require_converter("2.3.2")
    export = joe_exports[False]
    options = BuildOptions(target="rk3588", toolkit="2.3.2", max_regtask_lines=0, fail_on_cpu_ops=True,
                           min_simulator_snr_db=35.0)
    result = build_engine(export.onnx, tmp_path, options, selfcheck=export.selfcheck,
                          export_verdicts=export.verdicts)
    gates = {v.name: v for v in result.verdicts}
    assert gates["regtask_lines"].value == 0 and gates["cpu_compute_ops"].value == 0
    assert gates["simulator_snr[output]"].value >= 35.0
    plan = result.manifest_data["exec_plan"]
    assert plan == {"piper_tts.exec_plan": {"decoder": {"impl": "rknn", "artifacts": {"main": result.rknn.name}}}}
    window = PiperWindow.of(engine_contract(result.rknn))
    assert (window.latent_channels, window.hop, window.sample_rate) == (192, 256, 22050)


@pytest.mark.slow
def test_runtime_refuses_an_engine_of_another_voice(joe_exports):
    contract = engine_contract(joe_exports[False].onnx)
    runner = OnnxBackend(joe_exports[False].onnx, threads=1)
    VoiceDecoder(runner, contract, voice_channels=192)
    with pytest.raises(SetupError, match=r"192-channel latent but this voice has 16.*produced by: .*convert piper --voice-onnx"):
        VoiceDecoder(runner, contract, voice_channels=16)


# Rows of the rk3588 --dec-mask build log: the toolkit places the y_mask input's rank adapter
# ('y_mask_rs') after NPU layers, right before its first use. It is I/O glue, not a CPU op; the same
# Reshape under a name of the graph's own still counts.
DEC_MASK_TABLE = """\
D RKNN: [05:06:27.421] ID   OpType             DataType Target InputShape                               OutputShape            Cycles(DDR/NPU/Total)    RW(KB)       FullName
D RKNN: [05:06:27.421] ---------------------------------------------------------------------------------------------
D RKNN: [05:06:27.421] 0    InputOperator      FLOAT16  CPU    \\                                        (1,192,93)             0/0/0                    0            InputOperator:z
D RKNN: [05:06:27.421] 1    InputOperator      FLOAT16  CPU    \\                                        (1,1,93)               0/0/0                    0            InputOperator:y_mask
D RKNN: [05:06:27.421] 2    Reshape            FLOAT16  CPU    (1,192,93),(4)                           (1,192,1,93)           0/0/0                    34           Reshape:z_rs
D RKNN: [05:06:27.421] 3    Split              FLOAT16  NPU    (1,192,1,93),(2)                         (1,96,1,93),...        0/0/0                    34           Split:/flow/flows.6/Split
D RKNN: [05:06:27.421] 4    Conv               FLOAT16  NPU    (1,96,1,93),(192,96,1,1),(192)           (1,192,1,93)           3856/3456/3856           54           Conv:/flow/flows.6/pre/Conv
D RKNN: [05:06:27.421] 5    Reshape            FLOAT16  CPU    (1,1,93),(4)                             (1,1,1,93)             0/0/0                    0            Reshape:y_mask_rs
D RKNN: [05:06:27.421] 6    Conv               FLOAT16  NPU    (1,96,1,93),(96,96,1,1),(96)             (1,96,1,93)            3856/3456/3856           54           Conv:/flow/flows.6/post/Conv
D RKNN: [05:06:27.421] 7    OutputOperator     FLOAT16  CPU    (1,96,1,93)                              \\                      0/0/0                    34           OutputOperator:output
D RKNN: [05:06:27.421] ---------------------------------------------------------------------------------------------
"""


def test_input_adapter_placed_late_is_glue_but_a_graph_reshape_is_not():
    from rkaudio.gates.layer_table import cpu_ops_verdict, parse_layer_table

    assert cpu_ops_verdict(parse_layer_table(DEC_MASK_TABLE)).passed
    verdict = cpu_ops_verdict(parse_layer_table(DEC_MASK_TABLE.replace("Reshape:y_mask_rs", "Reshape:/dec/mask_rs")))
    assert not verdict.passed and "/dec/mask_rs" in verdict.detail


@pytest.mark.slow
def test_window_walk_through_the_simulator(joe, joe_exports, require_converter):
    """The same walk over the toolkit simulator (fp16): every window within the build's 35 dB gate."""
    from rkaudio.board.numeric import snr_db
    from rkaudio.host.backends import SimulatorBackend
    from rkaudio.board.window_walk import walk

    require_converter("2.3.2")
    export = joe_exports[False]
    contract = PiperWindow.of(engine_contract(export.onnx))
    z = joe.latents[0]["z"][:, :, : 2 * contract.window]
    reference = walk(OnnxBackend(export.onnx, threads=1), z, contract)
    with SimulatorBackend(export.onnx, "rk3588") as simulator:
        simulated = walk(simulator, z, contract)
    assert "interior" in [w.kind for w in simulated.windows]
    for win in simulated.windows:
        span = simulated.span(win)
        assert snr_db(reference.output[..., span], simulated.output[..., span]) >= 35.0
