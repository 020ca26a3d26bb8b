"""`convert inflect` from its declaration: --onnx alone compiles a slice with the verdicts its contract holds;
--onnx with --decode-onnx measures them again, at the thresholds given now, lowered to the weights' fp32 floor
where that is lower (no compile needed: --skip-rknn)."""
from __future__ import annotations

import subprocess
import sys

from rkaudio.core.paths import REPO_ROOT


def convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rkaudio.cli", "inflect", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)


def test_onnx_with_decode_onnx_is_measured_again(nano_official, nano_record, tmp_path):
    _, paths = nano_official
    kept = convert("--onnx", str(nano_record.onnx), "--skip-rknn", "--min-tail-db", "500")
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert "[PASS] tail_snr" in kept.stdout  # the export's own verdicts, at the export's thresholds
    assert "threshold: 500 dB" not in kept.stdout
    again = convert("--onnx", str(nano_record.onnx), "--decode-onnx", str(paths["decode"]), "--skip-rknn",
                    "--min-tail-db", "500")
    # Measured again at the bar given now, which the weights' fp32 floor (131.2 dB) lowers to 121.2 dB: no two fp32
    # decodes of these weights agree to 500 dB (rkaudio.gates.fp32_floor).
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "[PASS] tail_snr" in again.stdout and "threshold: 500 dB, or that floor" in again.stdout


def test_export_needs_decode_onnx(tmp_path):
    run = convert("--skip-rknn", "--out", str(tmp_path))
    assert run.returncode == 2 and "give --decode-onnx (the official onnx/decode.onnx) to export" in run.stderr
    bad = convert("--skip-rknn", "--window", "0", "--out", str(tmp_path))
    assert bad.returncode == 2 and "--window: input should be greater than or equal to 1" in bad.stderr


def test_slice_exported_for_a_wider_field_is_refused_before_the_build(nano_record):
    """The rk3588 slice holds the full-rate axes rk3566's field cannot: refused in one line, nothing compiled."""
    run = convert("--onnx", str(nano_record.onnx), "--target", "rk3566")
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert "exported without the polyphase levels rk3566's time field needs" in run.stderr
    assert "--target rk3566 --skip-rknn" in run.stderr
