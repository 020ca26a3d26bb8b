"""Real builds through the converter-venv child (tiny graphs, ~2-4 s each): the acceptance lines of issue 2
and every failure path of build_engine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from rkaudio.core.errors import BuildError
from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.toolkit.session import ConverterChild
from rkaudio.core.errors import GateFailure
from rkaudio.host.backends import OnnxBackend, SimulatorBackend
from tests.children import converter_children

CONVERT = [sys.executable, "-m", "rkaudio.cli"]
REPO = Path(__file__).resolve().parents[2]


def artifacts(out_dir: Path, stem: str) -> dict:
    return {suffix: (out_dir / f"{stem}{suffix}").exists() for suffix in (".rknn", ".manifest.json", ".build.log")}


def assert_no_engine_left(out_dir: Path, stem: str) -> None:
    assert artifacts(out_dir, stem) == {".rknn": False, ".manifest.json": False, ".build.log": True}
    assert not [p for p in out_dir.iterdir() if p.name.startswith(".")]  # no partial engine either


@pytest.mark.parametrize("target, toolkit", [("rk3588", "2.3.2"), ("rk3576", "2.3.2"), ("rk3566", "2.3.2"),
                                             ("rk3588", "2.5.0")])
def test_small_conv_graph_builds_clean(graph, inputs_npz, tmp_path, require_converter, target, toolkit):
    require_converter(toolkit)
    onnx_path = graph("small")
    result = build_engine(onnx_path, tmp_path / "out", BuildOptions(target=target, toolkit=toolkit),
                          selfcheck=inputs_npz(onnx_path))
    manifest = json.loads(result.manifest.read_text())
    assert manifest == result.manifest_data
    assert manifest["target"] == target and manifest["toolkit_version"] == toolkit
    assert manifest["regtask"]["lines"] == 0
    snr = [g for g in manifest["gates"] if g["name"] == "simulator_snr[y]"][0]
    assert snr["passed"] and snr["value"] >= 55.0
    assert manifest["rknn"]["bytes"] == result.rknn.stat().st_size > 0
    assert manifest["inputs"] == [{"name": "x", "shape": [1, 8, 64], "dtype": "float32"}]
    assert manifest["ops"]["cpu"] == 0 and manifest["est_cycles"] > 0 and manifest["weight_bytes"] > 0
    assert manifest["exec_plan"] == {"build_test.exec_plan": {"decoder": {
        "impl": "rknn", "artifacts": {"main": "small.rknn"}, "params": {"overlap": 0}}}}
    assert manifest["family"] == "build_test" and manifest["producer_git"]
    assert set(result.simulator_outputs) == {"y"}
    # The engine carries the contract essentials itself (config custom_string).
    assert b'"family":"build_test","component":"decoder"' in result.rknn.read_bytes()


def run_convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CONVERT, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_cli_regtask_gate_rk3566_fails_rk3588_passes(graph, tmp_path, require_converter):
    require_converter()
    onnx_path = graph("conv_sin", channels=22, length=16385, activation="Sin", blocks=3)
    failed = run_convert("build", str(onnx_path), "--target", "rk3566", "--out", str(tmp_path / "rk3566"),
                         "--max-regtask-lines", "10")
    assert failed.returncode == 3, failed.stderr
    assert "regtask_lines" in failed.stderr and "register field" in failed.stderr and "narrower window" in failed.stderr
    assert_no_engine_left(tmp_path / "rk3566", "conv_sin")

    passed = run_convert("build", str(onnx_path), "--target", "rk3588", "--out", str(tmp_path / "rk3588"),
                         "--max-regtask-lines", "10")
    assert passed.returncode == 0, passed.stderr
    manifest = json.loads((tmp_path / "rk3588" / "conv_sin.manifest.json").read_text())
    assert manifest["regtask"]["lines"] == 0
    assert [op["type"] for op in manifest["ops"]["cpu_ops"]] == ["Sin"] * 3  # Sin runs on the CPU on rk3588
    # the board-time prediction: its terms add up, and the three CPU Sins are its cpu_ops term
    predicted = manifest["predicted_board_ms"]
    assert predicted["ms"] == pytest.approx(sum(predicted["terms"].values()), abs=0.01)
    assert predicted["terms"]["cpu_ops"] > 0 and predicted["figures"]["cpu_bytes"] > 0
    assert predicted["figures"]["cycles"] == manifest["est_cycles"]
    shown = run_convert("inspect", str(tmp_path / "rk3588" / "conv_sin.rknn"))
    assert shown.returncode == 0, shown.stderr
    assert "regtask: 0 lines" in shown.stdout and "[PASS] simulator_snr[y]" in shown.stdout
    assert "cpu: Sin sin0" in shown.stdout and f"predicted board time: {predicted['ms']:,.1f} ms" in shown.stdout
    # each CPU op is priced: its traffic and its share of the cpu_ops term, which the shares add up to
    costs = [op["predicted_ms"] for op in manifest["ops"]["cpu_ops"]]
    assert all(op["rw_kb"] > 0 for op in manifest["ops"]["cpu_ops"]) and all(cost > 0 for cost in costs)
    assert sum(costs) == pytest.approx(predicted["terms"]["cpu_ops"], abs=0.01)
    assert f"cpu: Sin sin0 ({manifest['ops']['cpu_ops'][0]['rw_kb']:,.0f} KB" in shown.stdout


def test_cpu_ops_gate_fails_on_floor(graph, tmp_path, require_converter):
    require_converter()
    onnx_path = graph("conv_floor", activation="Floor")
    with pytest.raises(GateFailure) as failure:
        build_engine(onnx_path, tmp_path, BuildOptions(target="rk3588", fail_on_cpu_ops=True))
    (verdict,) = failure.value.verdicts
    assert verdict.name == "cpu_compute_ops" and verdict.value == 1 and "Floor:floor0" in verdict.detail
    assert_no_engine_left(tmp_path, "conv_floor")


def test_max_cpu_ops_gate(graph, tmp_path, require_converter):
    """`--max-cpu-ops N` passes a build with N CPU ops, names and prices them, and fails one with more."""
    require_converter()
    onnx_path = graph("conv_floor", activation="Floor")
    refused = run_convert("build", str(onnx_path), "--target", "rk3588", "--out", str(tmp_path / "refused"),
                          "--max-cpu-ops", "0")
    assert refused.returncode == 3 and "[FAIL] cpu_compute_ops: 1 ops (threshold 0)" in refused.stderr
    assert_no_engine_left(tmp_path / "refused", "conv_floor")
    allowed = run_convert("build", str(onnx_path), "--target", "rk3588", "--out", str(tmp_path / "allowed"),
                          "--max-cpu-ops", "1")
    assert allowed.returncode == 0, allowed.stderr
    assert "[PASS] cpu_compute_ops: 1 ops (threshold 1)" in allowed.stdout
    (op,) = json.loads((tmp_path / "allowed" / "conv_floor.manifest.json").read_text())["ops"]["cpu_ops"]
    assert op["type"] == "Floor" and op["predicted_ms"] > 0


def test_real_time_gate(graph, tmp_path, require_converter):
    """`convert build` of a family's ONNX gates the predicted board time per second of real time the family declares
    (a Qwen3 step of 64 code frames: 5.12 s of audio) where the engine keeps a CPU op (rk3566 runs Exp there): past
    --max-real-time-factor the build is refused, at the default (1.0) it passes with its figure. An engine with every
    op on the NPU records its figure and is not gated; a graph no family declares says it is not judged."""
    from rkaudio.core.contract import make_contract, set_contract

    require_converter()

    def qwen3_step(name: str, **graph_options) -> Path:
        step = tmp_path / f"{name}.onnx"
        onnx.save(set_contract(onnx.load(str(graph(f"{name}_plain", **graph_options))),
                               make_contract("qwen3-vocoder", "speech_decoder", "main", "qwen3_tts.exec_plan",
                                             frames=64)), str(step))
        return step

    def gate(out: Path, stem: str) -> dict:
        manifest = json.loads((out / f"{stem}.manifest.json").read_text())
        found = next(g for g in manifest["gates"] if g["name"] == "real_time_factor")
        assert found["value"] == pytest.approx(manifest["predicted_board_ms"]["ms"] / 1000 / 5.12, rel=1e-3)
        return found

    with_cpu_op = qwen3_step("exp_step", activation="Exp")
    refused = run_convert("build", str(with_cpu_op), "--target", "rk3566", "--out", str(tmp_path / "refused"),
                          "--max-real-time-factor", "1e-9")
    assert refused.returncode == 3 and "[FAIL] real_time_factor:" in refused.stderr, refused.stderr
    assert "per call of 5.12 s of audio (64 code frames at 12.5 Hz)" in refused.stderr
    assert "board-time constants are unfitted" in refused.stderr  # rk3566 has no board figure
    assert_no_engine_left(tmp_path / "refused", "exp_step")

    allowed = run_convert("build", str(with_cpu_op), "--target", "rk3566", "--out", str(tmp_path / "allowed"))
    assert allowed.returncode == 0, allowed.stderr
    found = gate(tmp_path / "allowed", "exp_step")
    assert found["passed"] and found["threshold"] == 1.0 and "not gated" not in found["detail"]

    all_npu = run_convert("build", str(qwen3_step("conv_step")), "--target", "rk3566", "--out", str(tmp_path / "npu"),
                          "--max-real-time-factor", "1e-9")
    assert all_npu.returncode == 0, all_npu.stderr
    found = gate(tmp_path / "npu", "conv_step")
    assert found["passed"] and found["value"] > found["threshold"] and "not gated: no op on the CPU" in found["detail"]

    unjudged = run_convert("build", str(graph("conv_rt")), "--target", "rk3588", "--out", str(tmp_path / "plain"))
    assert unjudged.returncode == 0, unjudged.stderr
    assert ("[PASS] real_time_factor: nan x real time (threshold 1)  not judged: no real time per call declared for "
            "family 'build_test'") in unjudged.stdout


def test_simulator_gate_fails_on_fp16_overflow(graph, inputs_npz, tmp_path, require_converter):
    require_converter()
    # Weights that fit fp16 (the fp16_constants gate passes) but whose conv output passes 65504: fine in fp32,
    # inf in the simulator.
    from rkaudio.gates.fp16_range import fp16_constants_verdict

    onnx_path = graph("overflow", gain=3e4)
    assert fp16_constants_verdict(onnx.load(str(onnx_path))).passed
    selfcheck = inputs_npz(onnx_path, scale=4.0)
    reference = OnnxBackend(onnx_path).run(dict(np.load(selfcheck)))["y"]
    assert np.isfinite(reference).all() and np.abs(reference).max() > 65504
    with pytest.raises(GateFailure) as failure:
        build_engine(onnx_path, tmp_path, BuildOptions(target="rk3588"), selfcheck=selfcheck)
    (verdict,) = failure.value.verdicts
    assert verdict.name == "simulator_snr[y]" and not verdict.passed and verdict.value < 35.0
    assert "overflow" in str(failure.value)
    assert_no_engine_left(tmp_path, "overflow")


def test_simulator_is_compared_with_reference_onnx_when_given(graph, inputs_npz, tmp_path, require_converter):
    require_converter()
    engine_graph, other_weights = graph("engine"), graph("reference", seed=1)
    with pytest.raises(GateFailure) as failure:
        build_engine(engine_graph, tmp_path, BuildOptions(target="rk3588"), selfcheck=inputs_npz(engine_graph),
                     reference_onnx=other_weights)
    assert [v.name for v in failure.value.verdicts] == ["simulator_snr[y]"]
    assert_no_engine_left(tmp_path, "engine")


def test_timeout_kills_child_with_sigkill_and_cleans_up(graph, tmp_path, require_converter):
    require_converter()
    child = ConverterChild(graph("small"), "rk3588", "2.3.2", tmp_path / "b.log", rknn_path=tmp_path / "b.rknn",
                           simulate=False, timeout_s=0.3)
    with pytest.raises(BuildError, match=r"killed by signal SIGKILL \(timeout: 0.3 s\)") as failure:
        child.wait_ready()
    assert failure.value.stage in ("start", "import", "config", "load", "build")
    assert not child.work_dir.exists() and not (tmp_path / "b.rknn").exists()


def test_toolkit_error_becomes_build_error_naming_the_stage(tmp_path, require_converter):
    require_converter()
    import onnx
    from onnx import TensorProto, helper

    spec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8]) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph([helper.make_node("Mystery", ["x"], ["y"], domain="com.example")],
                                                "unknown_op", spec[:1], spec[1:]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "mystery.onnx"))
    with pytest.raises(BuildError, match=r"stage 'build'.*Mystery") as failure:
        build_engine(tmp_path / "mystery.onnx", tmp_path, BuildOptions(target="rk3588"))
    assert failure.value.log_tail and "killed by signal" not in str(failure.value)
    assert_no_engine_left(tmp_path, "mystery")


def test_child_killed_by_sigsegv_leaves_no_artifact(graph, tmp_path, require_converter):
    require_converter()
    onnx_path = graph("segv", channels=22, length=4096)
    outcome: dict = {}

    def build() -> None:
        try:
            build_engine(onnx_path, tmp_path, BuildOptions(target="rk3588"))
        except BaseException as error:  # handed to the test thread
            outcome["error"] = error

    worker = threading.Thread(target=build)
    worker.start()
    # Strike once the child has announced its first stage (importing rknn takes over a second).
    log, deadline = tmp_path / "segv.build.log", time.monotonic() + 60
    while worker.is_alive() and time.monotonic() < deadline:
        pids = converter_children(stdout=log)  # not a simulator another test left open
        if pids and log.is_file() and '"stage": "import"' in log.read_text(errors="replace"):
            break
        time.sleep(0.02)
    assert pids, "the converter child never appeared"
    os.kill(pids[0], signal.SIGSEGV)
    worker.join(timeout=120)
    error = outcome.get("error")
    assert isinstance(error, BuildError), error
    assert "killed by signal SIGSEGV" in str(error)
    assert error.stage in ("import", "config", "load", "build", "export", "release")
    assert f"stage '{error.stage}'" in str(error)
    assert_no_engine_left(tmp_path, "segv")


def test_simulator_backend_serves_many_runs(graph, require_converter):
    require_converter()
    onnx_path = graph("served", activation="Sin")
    reference = OnnxBackend(onnx_path)
    rng = np.random.default_rng(1)
    with SimulatorBackend(onnx_path, "rk3588") as simulator:
        assert simulator.input_names == reference.input_names == ["x"]
        for _ in range(3):
            feeds = {"x": rng.standard_normal((1, 8, 64)).astype(np.float32)}
            expected, got = reference.run(feeds)["y"], simulator.run(feeds)["y"]
            assert got.shape == expected.shape
            noise = np.sum((got.astype(np.float64) - expected) ** 2)
            assert 10 * np.log10(np.sum(expected.astype(np.float64) ** 2) / noise) >= 55.0
