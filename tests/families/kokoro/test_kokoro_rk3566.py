"""The Kokoro generator on rk3566 (issue #26): the small generator at W=64 (fine axis 3841 samples, past the
11-bit field of rk3566's broadcast Expand) builds with 0 REGTASK lines and 0 CPU compute ops, and the same window
with the masked norm's mean subtracted by a Sub (its form before rkaudio.surgery.modules.instance_norm.centred_variance)
logs the lines (8 per Sub of a per-channel mean, REGTASK lite@0x1028 limit 0x7ff: the 176 of the real W=136
engine, 22 here). Two small engine builds, the simulator gate on the shipped form only."""
from __future__ import annotations

import torch

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.families.kokoro.export import export

from tests.kokoro_small import FRAMES, SMALL, small_job

EXPAND_LENGTH_LIMIT = 0x7FF  # rk3566's broadcast Expand length field (11 bits)


def test_the_rk3566_export_builds_without_regtask_lines_and_a_sub_of_the_mean_would_not(state, tmp_path,
                                                                                       require_converter,
                                                                                       monkeypatch):
    require_converter()
    assert SMALL.rates(FRAMES)[1] > EXPAND_LENGTH_LIMIT
    [record] = export(small_job(tmp_path / "rk3566", "rk3566"), SMALL, state, "random", "round")
    options = BuildOptions(target="rk3566", max_regtask_lines=0, fail_on_cpu_ops=True)
    result = build_engine(record.onnx, tmp_path / "rk3566", options, selfcheck=record.selfcheck,
                          export_verdicts=record.verdicts, reference_onnx=record.reference)
    manifest = result.manifest_data
    assert manifest["regtask"]["lines"] == 0 and manifest["ops"]["cpu"] == 0
    assert all(verdict.passed for verdict in result.verdicts)

    # the lines are the compiler's: no simulator run (no self-check) for the form that logs them
    import rkaudio.surgery.modules.instance_norm as norm

    monkeypatch.setattr(norm, "centred_variance",
                        lambda x, mean, mask, share, pool: pool(torch.pow((x - mean) * mask, 2), 1) / share)
    [sub_form] = export(small_job(tmp_path / "sub_form", "rk3566"), SMALL, state, "random", "round")
    lenient = BuildOptions(target="rk3566", max_regtask_lines=100_000, fail_on_cpu_ops=True)
    regtask = build_engine(sub_form.onnx, tmp_path / "sub_form", lenient).manifest_data["regtask"]
    print(f"small W={FRAMES} on rk3566: shipped form 0 REGTASK lines, Sub form {regtask['fields']}")
    assert regtask["lines"] > 0
    assert {(f["target"], f["offset"], f["limit"]) for f in regtask["fields"]} == {("lite", "0x1028", 0x7FF)}
