"""`convert check cosyvoice3`: the tiny ladder's ODE rendered to the mel through fp32 and through the engine
(onnxruntime on a fresh export; the rk3588 simulator on the suite's export), the mels written as .npy beside the
PNG, the engine's SNR printed."""
from __future__ import annotations

import math
import re

import numpy as np

from rkaudio.core.errors import SetupError


def overall_snr(output: str) -> float:
    return float(re.search(r"engine render vs fp32 render: (\S+) dB overall", output).group(1))


def rendered(out) -> tuple[np.ndarray, np.ndarray]:
    assert out.with_suffix(".png").is_file()
    return np.load(out), np.load(out.with_name(out.stem + ".fp32.npy"))


def test_onnx_backend_renders_a_fresh_tiny_export(check_cli, tmp_path):
    """--random-weights small at --lengths 16,24: 20 frames take the S=24 rung; onnxruntime on the engine graph with
    every tensor rounded to fp16 (the fp16 estimate) against the fp32 render."""
    out = tmp_path / "check.npy"
    result = check_cli("--random-weights", "small", "--lengths", "16,24", "--frames", "20", "--steps", "4",
                   "--out", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "check_engine").glob("*.onnx")) == [
        "cosyvoice3_flow_s16.onnx", "cosyvoice3_flow_s24.onnx"]
    assert "20 frames on the S=24 rung, 4-step ODE (onnxruntime, every tensor rounded to fp16" in result.output
    assert "prompt    [0, 6)" in result.output and "generated [6, 20)" in result.output
    engine, fp32 = rendered(out)
    assert engine.shape == fp32.shape == (80, 20) and np.all(np.isfinite(fp32))
    assert not np.array_equal(engine, fp32) and 20.0 < overall_snr(result.output) < math.inf


def test_simulator_opens_only_the_rung_it_uses(check_cli, tiny_export, tmp_path, require_converter):
    """28 frames on the suite's S=24/S=32 export: only S=32 is compiled, and the simulator's mel is close to fp32
    but not equal (fp16)."""
    require_converter()
    out = tmp_path / "sim.npy"
    onnx = [arg for record in tiny_export for arg in ("--onnx", str(record.onnx))]
    result = check_cli("--backend", "simulator", "--target", "rk3588", *onnx, "--frames", "28", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert re.findall(r"compiling (\S+) for rk3588", result.output) == ["cosyvoice3_flow_s32.onnx"]
    snr = overall_snr(result.output)
    print(f"tiny S=32 rung, 28 frames, 10 steps: simulator vs fp32 {snr:.1f} dB on the mel")
    assert math.isfinite(snr) and snr >= 40
    steps = re.search(r"after each ODE step: (.*) dB", result.output).group(1).split(", ")
    assert len(steps) == 10 and abs(float(steps[-1]) - snr) <= 0.05  # the last step is the mel
    engine, fp32 = rendered(out)
    assert engine.shape == fp32.shape == (80, 28)


def test_refusals(check_cli, tiny_export, tmp_path):
    onnx = ["--onnx", str(tiny_export[1].onnx)]
    for args, refusal in [
        ((*onnx, "--random-weights", "small"), "--onnx renders through an earlier export"),
        ((*onnx, "--frames", "33"), "33 frames exceeds the largest estimator rung (S=32"),
        (("--random-weights", "medium"), "--random-weights 'medium': expected one of real, small"),
        (("--random-weights", "small", "--lengths", "24,2"), "--lengths '24,2': each rung of 4 frames or more"),
    ]:
        result = check_cli(*args, "--out", str(tmp_path / "check.npy"))
        assert isinstance(result.exception, SetupError) and refusal in str(result.exception), (args, result.output)


def test_package_renders_through_its_onnx(check_cli, tiny_export, tmp_path):
    """--package: the ONNX its manifests name (here the suite's export), largest first on disk, chosen by length."""
    import json

    from rkaudio.core.contract import get_contract

    package = tmp_path / "cosyvoice3_flow_tiny_rk3588"
    package.mkdir()
    for record in reversed(tiny_export):
        (package / f"{record.onnx.stem}.manifest.json").write_text(json.dumps(
            {"contract": get_contract(record.onnx), "onnx": {"path": str(record.onnx)}}))
    out = tmp_path / "package.npy"
    result = check_cli("--package", str(package), "--frames", "10", "--steps", "2", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "10 frames on the S=24 rung, 2-step ODE (onnxruntime, every tensor rounded to fp16" in result.output
    assert rendered(out)[0].shape == (80, 10)
    result = check_cli("--package", str(package), "--lengths", "24", "--out", str(out))
    assert isinstance(result.exception, SetupError) and "drop --model-dir/--random-weights/--lengths" in str(
        result.exception)
