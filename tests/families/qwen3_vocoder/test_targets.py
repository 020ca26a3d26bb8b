"""The tiny B=16 step built for the smaller NPUs (issue #26): 0 REGTASK lines and the simulator gate at the recipe's
40 dB on rk3576 and rk3566, and no CPU compute op where the recipe lists the target. About a minute per target.

rk3566 still places the step's transformer glue on the CPU (Reshape/Transpose around the attention, its Softmax):
its CPU ops are printed, not gated, and the recipe leaves rk3566 out until they are gone."""
from __future__ import annotations

import pytest
import torch

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.families.qwen3_vocoder import MIN_SIMULATOR_SNR_DB
from rkaudio.families.qwen3_vocoder import step_export as E

# The targets the recipe lists: a CPU compute op there fails the test.
NO_CPU_OPS = ("rk3588", "rk3576")


@pytest.mark.parametrize("target", ["rk3576", "rk3566"])
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
