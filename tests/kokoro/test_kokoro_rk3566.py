"""The Kokoro generator on rk3566 (issue #26): the small generator at W=64 (fine axis 3841 samples, past the
11-bit field of rk3566's broadcast Expand) builds with 0 REGTASK lines and 0 CPU compute ops once exported for
rk3566, and the same window exported in the rk3588 form logs the lines (8 per Sub of a per-channel mean, REGTASK
lite@0x1028 limit 0x7ff: the 176 of the real W=136 engine, 22 here). Two small engine builds, the simulator gate
on the rk3566 form only."""
from __future__ import annotations

from converters.build.engine import BuildOptions, build_engine
from converters.families.kokoro.export import export
from runtime.board.soc import BROADCAST_SUB_LIMIT

from tests.kokoro.kokoro_small import FRAMES, SMALL


def test_the_rk3566_export_builds_without_regtask_lines_and_so_does_the_rk3588_form(state, exported, tmp_path,
                                                                                   require_converter):
    require_converter()
    assert SMALL.rates(FRAMES)[1] > BROADCAST_SUB_LIMIT["rk3566"]
    [record] = export(SMALL, state, "random", FRAMES, tmp_path / "rk3566", "round", True, target="rk3566")
    options = BuildOptions(target="rk3566", max_regtask_lines=0, fail_on_cpu_ops=True)
    result = build_engine(record.onnx, tmp_path / "rk3566", options, selfcheck=record.selfcheck,
                          export_verdicts=record.verdicts, reference_onnx=record.reference)
    manifest = result.manifest_data
    assert manifest["regtask"]["lines"] == 0 and manifest["ops"]["cpu"] == 0
    assert all(verdict.passed for verdict in result.verdicts)

    # the rk3588 form used to log lite@0x1028 lines here (its norm's x - mean was an Expand and a Sub); the norm
    # now subtracts the mean as an Add (surgery.modules.instance_norm.centred_variance), so it builds clean too
    lenient = BuildOptions(target="rk3566", max_regtask_lines=100_000, fail_on_cpu_ops=True)
    regtask = build_engine(exported[0].onnx, tmp_path / "rk3588_form", lenient).manifest_data["regtask"]
    print(f"small W={FRAMES} on rk3566: rk3566 form 0 REGTASK lines, rk3588 form {regtask['fields']}")
    assert regtask["lines"] == 0
