"""The Piper duration encoder on the real joe voice: export gates, the chain gate refusing a raw graph, the
drift gate, and one real narrow engine build (0 CPU ops, 0 REGTASK) with its ladder exec_plan."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from converters import pipeline
from converters.families.piper import encoder
from core.errors import GateFailure
from core.contract import get_contract


@pytest.fixture(scope="module")
def voice():
    return encoder.Voice(None)


@pytest.mark.parametrize("width", [128, 192])
def test_export_gates_pass(voice, tmp_path, width):
    record = encoder.export_width(voice, width, tmp_path)
    by_name = {v.name.split("[")[0]: v for v in record.verdicts}
    assert all(v.passed for v in record.verdicts), [v.line() for v in record.verdicts]
    assert by_name["relshift_rewrite_vs_raw"].value >= 120 and by_name["padded_vs_exact"].value >= 110
    contract = get_contract(record.onnx)
    assert (contract["component"], contract["role"], contract["ladder_key"]) == ("duration_encoder", "main", width)
    with np.load(record.selfcheck) as feeds:
        assert feeds["x_emb"].shape[-1] == width and 0 < feeds["x_mask"].sum() < width


def test_export_refuses_a_graph_that_keeps_a_shift_chain(voice, tmp_path, monkeypatch):
    monkeypatch.setattr(encoder, "npu_form", lambda raw: raw)  # skip the rewrite: the chains stay in
    with pytest.raises(GateFailure) as failure:
        pipeline.build([encoder.export_width(voice, 48, tmp_path)], tmp_path, None, context="piper encoder export")
    failed = {v.name: v for v in failure.value.verdicts}
    assert failed["relative-shift chains"].value == 12  # two per attention layer, six layers


def test_drift_gate_and_measure(voice):
    assert not encoder.drift_verdict(384, [1.0, -8.5], 7.0).passed
    assert encoder.drift_verdict(128, [1.0, -2.0], 7.0).passed
    ids = voice.sample_ids()[:60]
    feeds = voice.feeds(ids, 64)
    from onnxruntime import InferenceSession

    session = InferenceSession(encoder.slice_encoder(voice.model).SerializeToString(),
                               providers=["CPUExecutionProvider"])
    stats, dp_cond = session.run(None, voice.feeds(ids))
    reference = {"dp_cond": np.pad(dp_cond, [(0, 0), (0, 0), (0, 4)]), "x_mask": feeds["x_mask"]}
    assert encoder.duration_drift(voice, reference, reference, len(ids)) == 0.0
    shifted = {**reference, "dp_cond": reference["dp_cond"] * 1.5}
    assert encoder.duration_drift(voice, reference, shifted, len(ids)) != 0.0


def test_ladder_refuses_widths_over_the_drift_threshold(voice, tmp_path, monkeypatch):
    """Stand-in build and drift figures: the refused width's engine and manifest are removed and the
    exec_plan names only the kept widths."""
    def fake_build(width):
        rknn, manifest = tmp_path / f"piper_encoder_w{width}.rknn", tmp_path / f"piper_encoder_w{width}.manifest.json"
        rknn.write_bytes(b"engine")
        manifest.write_text("{}")
        data = {"contract": {"ladder_key": width}, "onnx": {"path": f"piper_encoder_w{width}.onnx"}}
        return SimpleNamespace(rknn=rknn, manifest=manifest, verdicts=[], manifest_data=data)

    monkeypatch.setattr(encoder, "measure_drift", lambda v, p, width, *a: [1.0, 9.5] if width > 128 else [0.5])
    built = [fake_build(width) for width in (128, 192)]
    kept = encoder.keep_ladder(built, None, tmp_path, "rk3588", "2.3.2", max_drift_pct=7.0)
    assert [r.rknn.name for r in kept] == ["piper_encoder_w128.rknn"]
    assert not (tmp_path / "piper_encoder_w192.rknn").exists()
    ladder = json.loads((tmp_path / "piper_encoder_ladder.json").read_text())
    assert ladder["widths"] == [128] and list(ladder["refused"]) == ["192"]
    assert ladder["exec_plan"]["piper_tts.exec_plan"]["duration_encoder"]["artifacts"]["main"] == \
        "piper_encoder_w128.rknn"


def test_engine_at_128_has_no_cpu_ops_and_measured_drift(require_converter, tmp_path):
    require_converter("2.3.2")
    results = encoder.run_encoder(voice_onnx=None, frames=[128], target="rk3588", toolkit="2.3.2",
                                  out_dir=tmp_path, skip_rknn=False, onnx=None, max_regtask_lines=0,
                                  fail_on_cpu_ops=True, min_snr_db=35.0, max_drift_pct=encoder.DEFAULT_MAX_DRIFT_PCT)
    assert len(results) == 1
    manifest = results[0].manifest_data
    assert manifest["ops"]["cpu"] == 0 and manifest["regtask"]["lines"] == 0
    assert all(v["passed"] for v in manifest["gates"])
    ladder = json.loads(Path(tmp_path / "piper_encoder_ladder.json").read_text())
    assert ladder["widths"] == [128] and len(ladder["drift_pct"]["128"]) == 3
