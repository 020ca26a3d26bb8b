"""Packaging: the merged exec_plan (ladders in ladder_key order), the atomic package dir, the summary row."""
import pytest

from rkaudio.board.contract import EngineContract
from rkaudio.core.errors import PackageError
from rkaudio.release.package import format_table, merge_exec_plan, staged_package, summary_row
from rkaudio.gates.fp16_floor import GAP_UNIT


def _contract(component="decoder", role="main", option="piper_tts.exec_plan", **shared):
    return EngineContract(family="piper", component=component, role=role, exec_plan_option=option, **shared)


def test_engines_of_one_role_form_a_ladder_in_ladder_key_order():
    plan = merge_exec_plan([
        ("enc_n192.rknn", _contract("duration_encoder", ladder_key=192)),
        ("dec_w93.rknn", _contract("decoder")),
        ("enc_n128.rknn", _contract("duration_encoder", ladder_key=128)),
        ("enc_n1024.rknn", _contract("duration_encoder", ladder_key=1024)),
    ])
    assert plan == {"piper_tts.exec_plan": {
        "decoder": {"impl": "rknn", "artifacts": {"main": "dec_w93.rknn"}},
        "duration_encoder": {"impl": "rknn", "artifacts": {"main": "enc_n128.rknn,enc_n192.rknn,enc_n1024.rknn"}},
    }}


def test_roles_and_params_of_one_component_share_its_entry():
    plan = merge_exec_plan([
        ("step64.rknn", _contract("speech_decoder", "main", "qwen3_tts.exec_plan", exec_params={"x": 1})),
        ("step16.rknn", _contract("speech_decoder", "first", "qwen3_tts.exec_plan", exec_params={"x": 1})),
    ])
    assert plan["qwen3_tts.exec_plan"]["speech_decoder"] == {
        "impl": "rknn", "artifacts": {"first": "step16.rknn", "main": "step64.rknn"}, "params": {"x": 1}}


def test_ambiguous_ladder_and_conflicting_params_are_refused():
    with pytest.raises(PackageError, match="ladder_key"):
        merge_exec_plan([("a.rknn", _contract()), ("b.rknn", _contract(ladder_key=2))])
    with pytest.raises(PackageError, match="exec_params"):
        merge_exec_plan([("a.rknn", _contract(exec_params={"overlap": 0})),
                         ("b.rknn", _contract(role="first", exec_params={"overlap": 2}))])


def test_staged_package_publishes_on_success_and_replaces_the_old_one(tmp_path):
    (tmp_path / ".pkg_rk3588.killed.partial" / "work").mkdir(parents=True)  # a killed run's leftovers
    with staged_package(tmp_path, "pkg_rk3588") as (work, package):
        (work / "scratch.onnx").write_text("x")
        (package / "new.rknn").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg_rk3588"]
    assert [p.name for p in (tmp_path / "pkg_rk3588").iterdir()] == ["new.rknn"]
    with staged_package(tmp_path, "pkg_rk3588") as (_, package):
        (package / "newer.rknn").write_text("newer")
    assert [p.name for p in (tmp_path / "pkg_rk3588").iterdir()] == ["newer.rknn"]


def test_staged_package_publishes_nothing_when_the_build_fails(tmp_path):
    with pytest.raises(RuntimeError):
        with staged_package(tmp_path, "pkg_rk3588") as (_, package):
            (package / "half.rknn").write_text("half")
            raise RuntimeError("gate failed")
    assert list(tmp_path.iterdir()) == []


def test_summary_row_sums_engines_and_takes_the_worst_snr():
    from rkaudio.board.verdict import Verdict, at_least, at_most

    # a verdict keeps its direction through JSON
    assert Verdict.from_json(at_most("x", 1, 2, "dB").to_json()).bound == "at_most"
    assert Verdict.from_json(at_least("x", 1, 2, "dB").to_json()).bound == "at_least"
    manifests = [
        {"gates": [{"name": "snr", "value": 61.5, "unit": "dB", "passed": True},
                   {"name": "regtask", "value": 0, "unit": "lines", "passed": True}],
         "rknn": {"bytes": 1000}, "regtask": {"lines": 0}, "predicted_board_ms": {"ms": 412.25},
         "ops": {"cpu": 1, "cpu_ops": [{"name": "t0", "type": "Transpose", "rw_kb": 8.0, "predicted_ms": 0.25}]}},
        {"gates": [{"name": "snr", "value": "inf", "unit": "dB", "passed": True},
                   # lower is better, in its own unit: never the worst SNR
                   {"name": "fp16_floor_gap[y]", "value": -8.4, "unit": GAP_UNIT, "passed": True},
                   # lower is better in dB (a masked-padding leak, cosyvoice3): an at-most gate is not an SNR
                   at_most("mask_one_detected[S=110]", 37.7, 40.0, "dB").to_json()],
         "rknn": {"bytes": 2000}, "regtask": {"lines": 3}, "predicted_board_ms": {"ms": 20.71},
         # a manifest from before the ops were priced: counted, unpriced
         "ops": {"cpu": 2, "cpu_ops": [{"name": "t1", "type": "Transpose", "rw_kb": 4.0, "predicted_ms": 0.125},
                                       {"name": "m0", "type": "Mul"}]}},
    ]
    row = summary_row("pkg_rk3588", "ok", manifests)
    assert row == {"package": "pkg_rk3588", "status": "ok", "gates": "5/5", "worst_snr_db": 61.5,
                   "engine_bytes": 3000, "cpu_ops": 3, "cpu_op_types": "2 Transpose 0.375 ms; 1 Mul",
                   "regtask_lines": 3, "kit_bytes": None, "package_bytes": None,
                   "components": None, "predicted_board_ms": "20.7-412.2"}  # alternatives (rungs): a range, no sum
    skipped = summary_row("other_rk3588", "missing source")
    assert skipped["gates"] == "-" and skipped["engine_bytes"] is None


def test_format_table_aligns_columns():
    text = format_table([{"a": "x", "b": 1234567}, {"a": "longer", "b": None}], ["a", "b"])
    lines = text.splitlines()
    assert lines[0].split() == ["a", "b"] and lines[2].split() == ["x", "1,234,567"] and lines[3].split() == ["longer", "-"]
    assert lines[2].index("1,234,567") == lines[3].index("-") == lines[0].index("b")


def test_assemble_copies_contract_package_files_once_and_refuses_a_missing_one(tmp_path):
    from types import SimpleNamespace

    from rkaudio.release.package import assemble

    work = tmp_path / "work"
    work.mkdir()
    (work / "plan.json").write_text("{}")
    results = []
    for stem in ("step_128", "head"):
        for suffix in (".onnx", ".rknn", ".manifest.json", ".build.log"):
            (work / f"{stem}{suffix}").write_text(stem)
        contract = {"exec_plan_option": "audio8_asr.exec_plan", "component": "decoder", "role": stem,
                    "package_files": ["plan.json"]}
        results.append(SimpleNamespace(rknn=work / f"{stem}.rknn", manifest=work / f"{stem}.manifest.json",
                                       build_log=work / f"{stem}.build.log",
                                       manifest_data={"contract": contract, "onnx": {"path": f"{stem}.onnx"}}))
    package = tmp_path / "pkg"
    package.mkdir()
    assemble(results, package)
    assert (package / "plan.json").read_text() == "{}"
    assert sorted(p.name for p in package.iterdir()) == sorted(
        ["plan.json", "exec_plan.json", *(f"{s}{x}" for s in ("step_128", "head") for x in (".rknn", ".manifest.json", ".build.log"))])

    (work / "plan.json").unlink()
    other = tmp_path / "pkg2"
    other.mkdir()
    with pytest.raises(PackageError, match="names plan.json, not found"):
        assemble(results, other)
