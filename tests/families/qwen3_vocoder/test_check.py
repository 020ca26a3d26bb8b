"""`convert check qwen3-vocoder`: code frames through the board's stream (the first group on B=16, the rest on B=64,
the last one right-padded), over the fp32 twins and over the engines (onnxruntime, the toolkit simulator), beside
the package decoder's full decode: three WAVs, a PNG, the engine's SNR per call and overall."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from rkaudio.cli import _register_all, app
from rkaudio.families.qwen3_vocoder import MIN_SIMULATOR_SNR_DB, onnx_name
from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG
from rkaudio.core.contract import get_contract
from rkaudio.core.errors import SetupError
from rkaudio.host.audio import read_wav

MIN_FP32_DB = 100.0  # the fp32 stream against the package decoder's full decode (121-124 dB measured)
OVERALL = re.compile(r"engine render vs fp32 render: (\S+) dB overall")


def check(*args: str):
    if not app.registered_commands:  # discovery runs once per process (main() does it at start)
        _register_all()
    return CliRunner().invoke(app, ["check", "qwen3-vocoder", *args])


def overall_snr(result) -> float:
    assert result.exit_code == 0, result.output + repr(result.exception)
    print(result.output)
    return float(OVERALL.search(result.output).group(1))


def assert_written(out, frames: int) -> None:
    """The engine, fp32 and full-decode WAVs, one sample count (the codes' frames), and the PNG."""
    samples = frames * math.prod(TINY_CONFIG["upsample_rates"] + TINY_CONFIG["upsampling_ratios"])
    for path in (out, out.with_suffix(".fp32.wav"), out.with_suffix(".full.wav")):
        audio, _ = read_wav(path)
        assert audio.size == samples, path
    assert out.with_suffix(".png").stat().st_size > 0


@pytest.fixture(scope="module")
def onnx_render(tmp_path_factory, tiny_snapshot):
    """The command's default: both steps exported at the recipe's B (16, 64), rendered over onnxruntime."""
    out = tmp_path_factory.mktemp("check_onnx") / "check.wav"
    return out, check("--model-dir", str(tiny_snapshot), "--out", str(out))


def test_onnx_backend_renders_every_kind_of_stream_call(onnx_render):
    out, result = onnx_render
    snr = overall_snr(result)
    # Run in fp32, the engine graph's round Snake sine is another function (13 dB): it runs rounded to fp16.
    assert math.isfinite(snr) and snr > MIN_SIMULATOR_SNR_DB
    calls = re.findall(r"span +\d+ (\w+) ", result.output)
    assert calls == ["first", "main", "main", "padded"]  # 16 + 2 x 64 + 32 frames
    fp32_vs_full = float(re.search(r"fp32 render vs full-length reference .*: (\S+) dB", result.output).group(1))
    assert fp32_vs_full > MIN_FP32_DB
    assert_written(out, 16 + 2 * 64 + 32)


def test_simulator_backend_renders_given_codes_through_a_lone_first_step(onnx_render, tiny_snapshot, tmp_path,
                                                                          require_converter):
    """The B=16 step alone (it plays main, as on the board) compiled in the simulator, on codes from a file."""
    require_converter()
    steps = onnx_render[0].parent / "check_engines"
    codes = np.random.default_rng(7).integers(0, TINY_CONFIG["codebook_size"], (TINY_CONFIG["num_quantizers"], 40))
    np.save(tmp_path / "codes.npy", codes)
    out = tmp_path / "sim.wav"
    result = check("--backend", "simulator", "--engine", str(steps / onnx_name("first", 16)),
                   "--codes", str(tmp_path / "codes.npy"), "--model-dir", str(tiny_snapshot), "--out", str(out))
    snr = overall_snr(result)
    assert "in the rknn-toolkit2 2.3.2 simulator" in result.output
    assert math.isfinite(snr) and snr > MIN_SIMULATOR_SNR_DB
    assert re.findall(r"span +\d+ (\w+) ", result.output) == ["first", "first", "padded"]
    assert_written(out, 40)


def test_a_package_renders_through_its_engines_onnx(onnx_render, tmp_path):
    """--package reads the ONNX each manifest names (contracts name the family `qwen3-vocoder`, its CLI name);
    without --model-dir the codes come from --codes and there is no full decode."""
    steps = onnx_render[0].parent / "check_engines"
    package = tmp_path / "package"
    package.mkdir()
    for onnx_path in (steps / onnx_name("first", 16), steps / onnx_name("main", 64)):
        manifest = {"contract": get_contract(onnx_path), "onnx": {"path": str(onnx_path)},
                    "target": "rk3588", "toolkit_version": "2.3.2"}
        (package / f"{onnx_path.stem}.manifest.json").write_text(json.dumps(manifest))
    np.save(tmp_path / "codes.npy", np.ones((1, TINY_CONFIG["num_quantizers"], 20), dtype=np.int32))
    out = tmp_path / "package.wav"
    result = check("--package", str(package), "--codes", str(tmp_path / "codes.npy"), "--out", str(out))
    assert overall_snr(result) > MIN_SIMULATOR_SNR_DB
    assert re.findall(r"span +\d+ (\w+) ", result.output) == ["first", "padded"]
    assert not out.with_suffix(".full.wav").exists()


@pytest.mark.parametrize("codes, refusal", [
    (np.zeros((3, 20), np.int64), r"expected integer code ids \[4, frames\], got int64 \[3, 20\]"),
    (np.full((4, 20), 0.5), r"expected integer code ids \[4, frames\], got float64"),
    (np.full((4, 20), TINY_CONFIG["codebook_size"]), r"ids run 32\.\.32, outside the codebook \[0, 32\)"),
])
def test_codes_that_do_not_fit_the_steps_are_refused(onnx_render, tiny_snapshot, tmp_path, codes, refusal):
    np.save(tmp_path / "codes.npy", codes)
    result = check("--engine", str(onnx_render[0].parent / "check_engines" / onnx_name("main", 64)),
                   "--codes", str(tmp_path / "codes.npy"), "--model-dir", str(tiny_snapshot),
                   "--out", str(tmp_path / "x.wav"))
    assert isinstance(result.exception, SetupError) and re.search(refusal, str(result.exception))
