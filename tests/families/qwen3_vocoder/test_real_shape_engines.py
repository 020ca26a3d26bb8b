"""The issue's engine acceptance on the real-shape config (random weights): B=16 and B=64 steps for rk3588,
each through both CLI stages (export with --skip-rknn, then --onnx), gated at 0 REGTASK lines, a simulator SNR of
40 dB against the exact fp32 graph, and (issue #43: the tail_matmul halo form) 0 CPU ops.

~4 min and ~14 GB peak (the B=64 compile) on 2 cores."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rkaudio.core.paths import REPO_ROOT
from tests.real_checkpoints import real_checkpoint

pytestmark = pytest.mark.slow


def convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rkaudio.cli", "qwen3-vocoder", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
@real_checkpoint
def real_snapshot(tmp_path_factory):
    from rkaudio.families.qwen3_vocoder.random_model import write_random_snapshot
    from rkaudio.families.qwen3_vocoder.snapshot import REAL_SHAPE_DECODER_CONFIG

    return write_random_snapshot(tmp_path_factory.mktemp("real_snapshot"), REAL_SHAPE_DECODER_CONFIG, seed=3)


@pytest.mark.parametrize("role, frames", [("first", 16), ("main", 64)])
def test_real_shape_engine_for_rk3588(real_snapshot, tmp_path, require_converter, role, frames):
    require_converter()
    onnx_path = tmp_path / f"step_{frames}.onnx"
    exported = convert("--model-dir", str(real_snapshot), "--codes-length", str(frames), "--role", role,
                       "--skip-rknn", "--output", str(onnx_path))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "cache_numel 1298576, head_dim 64, kv_len 71" in exported.stdout
    built = convert("--onnx", str(onnx_path), "--target", "rk3588", "--out", str(tmp_path / "engines"))
    print(built.stdout)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    manifest = json.loads((tmp_path / "engines" / f"step_{frames}.manifest.json").read_text())
    gates = {g["name"]: g for g in manifest["gates"]}
    assert gates["regtask_lines"]["value"] == 0
    assert gates["simulator_snr[pcm]"]["passed"] and gates["simulator_snr[pcm]"]["threshold"] == 40.0
    assert gates["simulator_snr[cache_out]"]["passed"]
    cpu_ops = [op["type"] for op in manifest["ops"]["cpu_ops"]]
    print(f"real-shape B={frames}: simulator {gates['simulator_snr[pcm]']['value']:.2f} dB (pcm), "
          f"{(tmp_path / 'engines' / f'step_{frames}.rknn').stat().st_size} bytes, CPU ops ({len(cpu_ops)}): {cpu_ops}")
    assert manifest["contract"]["halo_form"] == "tail_matmul" and cpu_ops == []
