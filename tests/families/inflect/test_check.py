"""`convert check inflect`: tokens -> duration.onnx -> noise head -> the latent walked through the slice's fp32
ONNX and through the engine (onnxruntime: the very graph, no fp32 twin, so exact; the toolkit simulator: fp16),
beside decode.onnx's full-length decode; three WAVs, a PNG and the engine's SNR against fp32."""
from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from rkaudio.cli import _register_all, app

TOKENS = ",".join(map(str, [0, 12, 0, 40, 0, 77, 0, 3, 0, 150, 0, 9, 0] * 5))  # 2 windows of the 256-slice engine


def check(paths, *args):
    _register_all()
    return CliRunner().invoke(app, ["check", "inflect", "--duration-onnx", str(paths["duration"]), "--tokens", TOKENS,
                                    "--decode-onnx", str(paths["decode"]), *map(str, args)])


def test_onnx_backend_renders_the_slice_as_the_fp16_estimate(nano_official, nano_slice, tmp_path, check_report):
    out = tmp_path / "inflect.wav"
    result = check(nano_official[1], "--engine", nano_slice, "--out", out)
    assert result.exit_code == 0, result.output
    assert 20.0 < check_report(result.output, out) < math.inf and "the fp16 estimate" in result.output
    assert " first " in result.output and " last " in result.output
    assert "fp32 render vs full-length reference (the windowing alone)" in result.output


@pytest.mark.slow
def test_simulator_backend_renders_the_compiled_slice(nano_official, nano_slice, tmp_path, check_report,
                                                      require_converter):
    require_converter("2.3.2")
    out = tmp_path / "inflect.wav"
    result = check(nano_official[1], "--engine", nano_slice, "--out", out, "--backend", "simulator")
    assert result.exit_code == 0, result.output
    snr = check_report(result.output, out)
    print(f"inflect nano, simulator rk3588 vs fp32: {snr:.1f} dB")
    assert 35.0 <= snr < math.inf, result.output


def test_without_a_decoder_it_says_what_to_pass(nano_official, tmp_path):
    result = check(nano_official[1], "--out", tmp_path / "inflect.wav")
    assert result.exit_code != 0 and "give the decoder: --engine" in str(result.exception)
    rknn = check(nano_official[1], "--engine", tmp_path / "x.rknn", "--backend", "simulator")
    assert rknn.exit_code != 0 and "runs on the board" in str(rknn.exception)


def test_package_names_the_slice(nano_official, nano_slice, tmp_path, check_report):
    """--package DIR renders the ONNX its manifest names; with --engine too it asks for one."""
    import json

    from rkaudio.core.contract import get_contract

    package = tmp_path / "inflect_nano_v2_decoder_rk3588"
    package.mkdir()
    (package / "inflect_v2_decoder_c128_w256.manifest.json").write_text(json.dumps(
        {"contract": get_contract(nano_slice), "onnx": {"path": str(nano_slice)}, "target": "rk3588",
         "toolkit_version": "2.3.2"}))
    out = tmp_path / "inflect.wav"
    result = check(nano_official[1], "--package", package, "--out", out)
    assert result.exit_code == 0, result.output
    assert check_report(result.output, out) < math.inf and nano_slice.stem in result.output
    both = check(nano_official[1], "--package", package, "--engine", nano_slice, "--out", out)
    assert both.exit_code != 0 and "both name an engine" in str(both.exception)
