"""The Piper duration encoder on the real joe voice: export gates, the chain gate refusing a raw graph, the
drift gate, and one real narrow engine build (0 CPU ops, 0 REGTASK) with its ladder exec_plan."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rkaudio.pipeline import pipeline
from rkaudio.families.piper import encoder
from rkaudio.core.errors import GateFailure
from rkaudio.core.contract import get_contract
from tests.real_checkpoints import real_checkpoint


@pytest.fixture(scope="module")
@real_checkpoint
def voice():
    return encoder.Voice(None)


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 192])
def test_export_gates_pass(voice, tmp_path, width):
    record = encoder.export_width(_encoder_job(tmp_path), voice, width)
    by_name = {v.name.split("[")[0]: v for v in record.verdicts}
    assert all(v.passed for v in record.verdicts), [v.line() for v in record.verdicts]
    assert by_name["relshift_rewrite_vs_raw"].value >= 120 and by_name["padded_vs_exact"].value >= 110
    contract = get_contract(record.onnx)
    assert (contract["component"], contract["role"], contract["ladder_key"]) == ("duration_encoder", "main", width)
    with np.load(record.selfcheck) as feeds:
        assert feeds["x_emb"].shape[-1] == width and 0 < feeds["x_mask"].sum() < width


@pytest.mark.slow
def test_export_refuses_a_graph_that_keeps_a_shift_chain(voice, tmp_path, monkeypatch):
    monkeypatch.setattr(encoder, "npu_form", lambda raw, target: raw)  # skip the rewrite: the chains stay in
    with pytest.raises(GateFailure) as failure:
        pipeline.build([encoder.export_width(_encoder_job(tmp_path), voice, 48)], tmp_path, None,
                       context="piper encoder export")
    failed = {v.name: v for v in failure.value.verdicts}
    assert failed["relative-shift chains"].value == 12  # two per attention layer, six layers


@pytest.mark.slow
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


def _forced_drift(monkeypatch, figures: dict[int, list[float]]):
    """Stand-in drift figures per width (the real ones need a simulator run per width and rarely differ)."""
    monkeypatch.setattr(encoder, "measure_drift", lambda voice, path, width, *args: figures[width])


@pytest.mark.slow
def test_a_width_past_the_drift_threshold_is_refused_before_the_build(tmp_path, monkeypatch, require_converter):
    """The refused width is never exported, so the build, its self-test goldens and the ladder's end-to-end
    golden all name the kept width only; the kept width's drift verdict travels in its contract."""
    require_converter("2.3.2")
    _forced_drift(monkeypatch, {32: [0.5, -1.0], 48: [1.0, 9.5]})
    records = encoder.export(_encoder_job(tmp_path, [48, 32], max_drift_pct=7.0))
    assert [r.onnx.name for r in records] == ["piper_encoder_w32.onnx"]
    assert not list(tmp_path.glob("piper_encoder_w48.*"))
    drift = {v.name: v for v in records[0].verdicts}["duration_drift[N=32]"]
    assert drift.passed and drift.value == 1.0
    assert pipeline.Exported.from_onnx(records[0].onnx, "piper").verdicts == records[0].verdicts
    assert json.loads(records[0].end_to_end.read_text())["engines"] == ["piper_encoder_w32.rknn"]
    ladder = json.loads((tmp_path / "piper_encoder_ladder.json").read_text())
    assert ladder["widths"] == [32] and list(ladder["refused"]) == ["48"] and ladder["drift_pct"]["48"] == [1.0, 9.5]
    assert ladder["exec_plan"]["piper_tts.exec_plan"]["duration_encoder"]["artifacts"]["main"] == \
        "piper_encoder_w32.rknn"

    from rkaudio.engine.build import BuildOptions
    from rkaudio.board.files import KIT_DIR

    results = pipeline.build(records, tmp_path, BuildOptions(target="rk3588"), context="piper encoder export")
    assert [r.rknn.name for r in results] == ["piper_encoder_w32.rknn"]
    index = json.loads((tmp_path / KIT_DIR / "index.json").read_text())
    assert [engine["engine"] for engine in index["engines"]] == ["piper_encoder_w32.rknn"]
    (golden,) = index["end_to_end"]
    assert golden["engines"] == ["piper_encoder_w32.rknn"]
    assert [call["engine"] for call in golden["calls"]] == ["piper_encoder_w32.rknn"]


@pytest.mark.slow
def test_every_width_refused_is_a_gate_failure(tmp_path, monkeypatch):
    _forced_drift(monkeypatch, {32: [8.0], 48: [-9.0]})
    with pytest.raises(GateFailure, match="every width drifts past the threshold") as failure:
        encoder.export(_encoder_job(tmp_path, [32, 48], max_drift_pct=7.0))
    assert [v.name for v in failure.value.verdicts] == ["duration_drift[N=32]", "duration_drift[N=48]"]
    assert not list(tmp_path.glob("piper_encoder_w*.onnx"))


def _encoder_job(tmp_path, frames=(128,), **gates):
    """The job `convert piper --encoder --frames 128` makes for rk3588 (its gates: the declared defaults, `gates`
    over them)."""
    from rkaudio.families.piper import FAMILY

    return FAMILY.job("duration_encoder", target="rk3588", out=tmp_path, toolkit="2.3.2",
                      options={"frames": list(frames)},
                      gates={"max_regtask_lines": 0, "fail_on_cpu_ops": True, **gates})


def test_drift_threshold_with_onnx_is_refused(tmp_path):
    from rkaudio.pipeline import pipeline
    from rkaudio.core.errors import SetupError

    with pytest.raises(SetupError, match="--max-drift-pct is measured at export"):
        pipeline.run(_encoder_job(tmp_path, max_drift_pct=7.0), from_onnx=tmp_path / "piper_encoder_w128.onnx")


@pytest.mark.slow
def test_engine_at_128_has_no_cpu_ops_and_measured_drift(require_converter, tmp_path):
    from rkaudio.pipeline import pipeline

    require_converter("2.3.2")
    results = pipeline.run(_encoder_job(tmp_path, max_drift_pct=encoder.DEFAULT_MAX_DRIFT_PCT))
    assert len(results) == 1
    manifest = results[0].manifest_data
    assert manifest["ops"]["cpu"] == 0 and manifest["regtask"]["lines"] == 0
    assert all(v["passed"] for v in manifest["gates"])
    ladder = json.loads(Path(tmp_path / "piper_encoder_ladder.json").read_text())
    assert ladder["widths"] == [128] and len(ladder["drift_pct"]["128"]) == 3


def test_a_degenerate_encoder_reference_fails_without_a_figure():
    from rkaudio.gates.verdict import refuse_degenerate
    from rkaudio.board.verdict import at_least

    real = np.random.default_rng(0).standard_normal((1, 4, 20)).astype(np.float32)
    verdict = at_least("padded_vs_exact[N=20]", 130.0, encoder.MIN_PADDED_DB, "dB")
    assert encoder._judged_per_output(verdict, [({"stats": real, "dp_cond": real}, 17)]) == verdict
    silent = [({"stats": real, "dp_cond": np.zeros_like(real)}, 17), ({"stats": real, "dp_cond": real * 0}, 20)]
    judged = encoder._judged_per_output(verdict, silent)
    assert not judged.passed and np.isnan(judged.value) and judged.detail.startswith("dp_cond: the reference output "
                                                                                     "is silent")
    assert judged.degenerate == judged.detail and judged.outcome == "degenerate"
    with pytest.raises(GateFailure, match="the comparison has nothing to judge"):
        refuse_degenerate([judged], "piper encoder export")


@pytest.mark.slow
def test_the_width_ladder_builds_as_one_dynamic_engine(require_converter, tmp_path):
    """`--ladder dynamic`: the widths merge into one engine (the band tables are leading corners of the widest), every
    per-width gate passes, and each width's own layer table shows what compiles differently from the static widths:
    the six band ReduceSums run on the CPU (so the recipe's static widths stay the default)."""
    from dataclasses import replace

    from rkaudio.pipeline import pipeline

    require_converter("2.3.2")
    job = _encoder_job(tmp_path, fail_on_cpu_ops=False)
    from rkaudio.families.piper import FAMILY

    options = FAMILY.options_model(FAMILY.component("duration_encoder"))
    job = replace(job, options=options(frames=[64, 128], ladder="dynamic"))
    results = pipeline.run(job)
    assert [r.rknn.name for r in results] == ["piper_encoder_ladder.rknn"]
    manifest = results[0].manifest_data
    assert [entry["contract"]["frames"] for entry in manifest["shape_sets"]] == [64, 128]
    assert all(v["passed"] for v in manifest["gates"])
    for entry in manifest["shape_sets"]:
        assert entry["regtask"]["lines"] == 0
        assert sorted({op["type"] for op in entry["ops"]["cpu_ops"]}) == ["ReduceSum"] and entry["ops"]["cpu"] == 6


@pytest.mark.slow
def test_recipe_builds_joe_w128_for_rk3566_in_the_exp_ratio_form(require_converter, tmp_path):
    """The release recipe's rk3566 duration-encoder cell, its ladder cut to w128 (the joe voice, as `convert engines`
    builds it): the exp-ratio relative attention (no Softmax, no Transpose of its own) keeps 0 REGTASK lines, the
    CPU ops its gates allow, and every gate passes, the row-max logit gate among the export verdicts."""
    from rkaudio.cli.families import declaration
    from rkaudio.core.paths import REPO_ROOT
    from rkaudio.families.piper import FAMILY
    from rkaudio.release import recipes

    require_converter("2.3.2")
    recipe = recipes.load_recipe(REPO_ROOT / "recipes" / "piper_joe_medium.toml", declaration)
    encoder_part = recipe["components"]["duration_encoder"]
    cut = {**recipe, "components": {"duration_encoder": {**encoder_part,
                                                         "options": {**encoder_part["options"], "frames": [128]}}}}
    (part,) = recipes.recipes_for(cut, "rk3566")
    gates = part["gates"]
    allowed = 0 if gates.get("fail_on_cpu_ops") else gates.get("max_cpu_ops")
    results, built_from = recipes.build_cell(cut, "duration_encoder", "rk3566", "2.3.2", tmp_path, FAMILY)
    assert built_from == recipes.CHECKPOINT and [r.rknn.name for r in results] == ["piper_encoder_w128.rknn"]
    manifest = results[0].manifest_data
    assert manifest["regtask"]["lines"] == 0 and allowed is not None and manifest["ops"]["cpu"] <= allowed
    assert all(v["passed"] for v in manifest["gates"]), [v for v in manifest["gates"] if not v["passed"]]
    assert "attention_logit_max_abs[N=128]" in {v["name"] for v in manifest["gates"]}
    import onnx

    model = onnx.load(str(results[0].rknn.with_suffix(".onnx")), load_external_data=False)
    ops = {node.op_type for node in model.graph.node}
    assert "Softmax" not in ops and "Sigmoid" in ops
