"""The tiny steps built for the smaller NPUs (issue #26): the B=16 step with 0 REGTASK lines, the simulator gate at
the recipe's 40 dB and no CPU compute op on rk3576; on rk3566 the B=64 step the command exports in the exp-ratio
attention form (issue #42), with no attention op on the CPU and its other CPU ops (the cache and halo layout, the
RMSNorms, the mask: issue #43) held to a count. About a minute per target."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.families.qwen3_vocoder import MIN_SIMULATOR_SNR_DB
from rkaudio.families.qwen3_vocoder import step_export as E

from rkaudio.core.paths import REPO_ROOT

# The targets the recipe lists: a CPU compute op there fails the test.
NO_CPU_OPS = ("rk3588", "rk3576")
# The tiny B=64 step's CPU compute ops on rk3566 (toolkit 2.3.2): 81 in the native attention form (2 exSoftmax13 and
# 14 head Reshapes / Transposes among them), 65 in the exp-ratio form, none of them attention's: 50 around the cache
# entries (the K/V histories' among them) and the row convs' halos, 8 layout changes of the quantizer and the pre-conv,
# 5 Transposes around the RMSNorms' Pow, and the mask's Mul and Transpose (built from the cache's validity flags).
RK3566_TINY_CPU_OPS = 65
# What a CPU op of attention is named or typed by: the Softmax (exSoftmax13 in the layer table), the exp-ratio ops
# that replace it, and the head Reshapes / Transposes / MatMuls of each layer's self_attn.
ATTENTION_OP_TYPES = ("Softmax", "exSoftmax13")
ATTENTION_OP_NAMES = ("self_attn",)


@pytest.mark.parametrize("target", ["rk3576"])
def test_tiny_step_builds_without_regtask_lines(step_job, tiny_step, tiny_reference, tmp_path, require_converter,
                                                target):
    require_converter()
    with torch.no_grad():
        record = E.export_step(step_job, tiny_step, 16, "first", tmp_path / "step_16.onnx", reference=tiny_reference,
                               say=lambda *_: None)
    result = build_engine(record.onnx, tmp_path / target,
                          BuildOptions(target=target, max_regtask_lines=0, min_simulator_snr_db=MIN_SIMULATOR_SNR_DB,
                                       fail_on_cpu_ops=target in NO_CPU_OPS),
                          selfcheck=record.selfcheck, reference_onnx=record.reference)
    manifest = result.manifest_data
    gates = {g["name"]: g for g in manifest["gates"]}
    cpu_ops = [op["type"] for op in manifest["ops"]["cpu_ops"]]
    print(f"tiny B=16 step for {target}: {manifest['regtask']['lines']} REGTASK lines, simulator "
          f"{gates['simulator_snr[pcm]']['value']:.1f} dB (pcm), CPU ops ({len(cpu_ops)}): {cpu_ops}")
    assert manifest["regtask"]["lines"] == 0 and gates["regtask_lines"]["passed"]
    assert gates["simulator_snr[pcm]"]["passed"] and gates["simulator_snr[cache_out]"]["passed"]
    if target in NO_CPU_OPS:
        assert cpu_ops == []


def test_tiny_step_on_rk3566_keeps_attention_off_the_cpu(tiny_snapshot, tmp_path, require_converter):
    """`convert qwen3-vocoder --target rk3566 --max-cpu-ops N`: the exp-ratio attention form, 0 REGTASK lines, the
    simulator gate, no attention op on the CPU, exactly RK3566_TINY_CPU_OPS CPU ops, the logit bound in the manifest."""
    require_converter()
    run = subprocess.run([sys.executable, "-m", "rkaudio.cli", "qwen3-vocoder", "--model-dir", str(tiny_snapshot),
                          "--codes-length", "64", "--target", "rk3566", "--max-regtask-lines", "0",
                          "--max-cpu-ops", str(RK3566_TINY_CPU_OPS), "--out", str(tmp_path)],
                         cwd=REPO_ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    manifest = json.loads((tmp_path / "qwen3_vocoder_main_64.manifest.json").read_text())
    gates = {g["name"]: g for g in manifest["gates"]}
    cpu_ops = manifest["ops"]["cpu_ops"]
    attention = [op for op in cpu_ops if op["type"] in ATTENTION_OP_TYPES
                 or any(part in op["name"] for part in ATTENTION_OP_NAMES)]
    print(f"tiny B=64 step for rk3566: {manifest['regtask']['lines']} REGTASK lines, simulator "
          f"{gates['simulator_snr[pcm]']['value']:.1f} dB (pcm), CPU ops ({len(cpu_ops)}): "
          f"{[op['type'] for op in cpu_ops]}")
    assert manifest["regtask"]["lines"] == 0 and gates["regtask_lines"]["passed"]
    assert gates["simulator_snr[pcm]"]["passed"] and gates["simulator_snr[cache_out]"]["passed"]
    assert attention == []
    assert len(cpu_ops) == RK3566_TINY_CPU_OPS, "fewer CPU ops: lower RK3566_TINY_CPU_OPS to the new count"
    assert gates["cpu_compute_ops"]["passed"] and gates["cpu_compute_ops"]["threshold"] == RK3566_TINY_CPU_OPS
    for name in ("attention_logit_max", "attention_row_max_floor"):
        assert gates[name]["passed"] and gates[name]["unit"] == "logit", gates[name]
    assert gates["attention_logit_max"]["threshold"] == 8.0


def test_every_cache_entry_fills_its_aligned_slots():
    """The cache join is one Concat of every entry: an entry followed by a zero piece (the 71 attention flags of the
    real shape, then 9 zeros) put that whole Concat on the CPU (rk3588 and rk3576, real shape)."""
    from rkaudio.families.qwen3_vocoder.cache import CACHE_ALIGNMENT
    from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG
    from rkaudio.families.qwen3_vocoder.snapshot import REAL_SHAPE_DECODER_CONFIG
    from rkaudio.families.qwen3_vocoder.step import StreamingDecoder

    for config in (TINY_CONFIG, REAL_SHAPE_DECODER_CONFIG):
        with torch.device("meta"):  # the layout only: no weights allocated
            layout = StreamingDecoder(config).layout
        unaligned = {e.name: e.numel for e in layout.entries if e.numel % CACHE_ALIGNMENT}
        assert not unaligned, f"entries that need a zero piece in the join: {unaligned}"
