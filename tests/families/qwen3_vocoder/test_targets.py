"""The tiny steps built for the smaller NPUs (issue #26): the B=16 step with 0 REGTASK lines, the simulator gate at
the recipe's 40 dB and no CPU compute op on rk3576; on rk3566 the recipe's steps in the exp-ratio attention form
(issue #42) and the tail_transpose halo form (issue #43), with no attention op on the CPU and the other CPU ops (the
cache entries, the quantizer, the mask) within the recipe's allowance. About a minute per target."""
from __future__ import annotations

import json
import pytest
import torch

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.families.qwen3_vocoder import MIN_SIMULATOR_SNR_DB
from rkaudio.families.qwen3_vocoder import step_export as E

from rkaudio.core.paths import REPO_ROOT

RECIPE = "qwen3_tts_0_6b_base_speech_decoder"

# The targets the recipe lists: a CPU compute op there fails the test.
NO_CPU_OPS = ("rk3588", "rk3576")
# The tiny steps' CPU compute ops on rk3566 (toolkit 2.3.2), none of them attention's: B=64 81 in the native attention
# form, 65 in the exp-ratio form (issue #42), 44 at B=16 and B=64 with the tail_transpose halo form, RMSNorm's square as
# x * x and the quantizer's sum as Adds (issue #43): the cache entries' reads and writes (the row convs' tails
# crossing between the cache's time-major order and the rows, the K/V histories, the pre-conv's tail), the quantizer's
# code layout and the mask's Mul and Transpose (built from the cache's validity flags). The recipe's allowance
# (max_cpu_ops for rk3566) is the real shape's.
RK3566_TINY_CPU_OPS = {"qwen3_vocoder_first_16": 44, "qwen3_vocoder_main_64": 44}
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


def test_the_recipe_builds_the_tiny_steps_for_rk3566(tmp_path, require_converter):
    """`convert engines --target rk3566` on the shipped recipe, from a tiny random snapshot: both steps in the exp-ratio
    attention form and the tail_transpose halo form, 0 REGTASK lines, the simulator gate, no attention op on the CPU,
    the CPU ops the recipe allows for rk3566 (and exactly RK3566_TINY_CPU_OPS), and the package's stream golden
    replayed on the host by the kit's self-test."""
    import tomllib

    from rkaudio.board.selftest import SelfTest
    from rkaudio.cli.families import declaration
    from rkaudio.release import recipes
    from rkaudio.release.kit import HostOpener

    require_converter()
    shipped = (REPO_ROOT / "recipes" / f"{RECIPE}.toml").read_text()
    allowed = tomllib.loads(shipped)["gates"]["max_cpu_ops"]["rk3566"]
    declaration("qwen3_vocoder").random_source(tmp_path / "models" / "Qwen3-TTS-12Hz-0.6B-Base", "small", {})
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / f"{RECIPE}.toml").write_text(shipped)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RKAUDIO_MODELS", str(tmp_path / "models"))
        rows = recipes.build_all("rk3566", declaration, "2.3.2", tmp_path / "recipes", tmp_path / "dist",
                                 say=lambda line: None)
    assert [(r["package"], r["status"]) for r in rows] == [(f"{RECIPE}_rk3566", "ok")], rows
    package = tmp_path / "dist" / "rk3566" / f"{RECIPE}_rk3566"
    for stem, count in RK3566_TINY_CPU_OPS.items():
        manifest = json.loads((package / f"{stem}.manifest.json").read_text())
        gates = {g["name"]: g for g in manifest["gates"]}
        cpu_ops = manifest["ops"]["cpu_ops"]
        attention = [op for op in cpu_ops if op["type"] in ATTENTION_OP_TYPES
                     or any(part in op["name"] for part in ATTENTION_OP_NAMES)]
        print(f"tiny {stem} for rk3566: {manifest['regtask']['lines']} REGTASK lines, simulator "
              f"{gates['simulator_snr[pcm]']['value']:.1f} dB (pcm), halo form {manifest['contract']['halo_form']}, "
              f"CPU ops ({len(cpu_ops)}, recipe allows {allowed}): {[op['type'] for op in cpu_ops]}")
        assert manifest["contract"]["halo_form"] == "tail_transpose"
        assert manifest["regtask"]["lines"] == 0 and gates["regtask_lines"]["passed"]
        assert gates["simulator_snr[pcm]"]["passed"] and gates["simulator_snr[cache_out]"]["passed"]
        assert attention == []
        assert gates["cpu_compute_ops"]["passed"] and gates["cpu_compute_ops"]["threshold"] == allowed
        assert len(cpu_ops) == count, f"{stem}: {len(cpu_ops)} CPU ops; fewer: lower RK3566_TINY_CPU_OPS"
        for name in ("attention_logit_max", "attention_row_max_floor"):
            assert gates[name]["passed"] and gates[name]["unit"] == "logit", gates[name]
        assert gates["attention_logit_max"]["threshold"] == 8.0
    with HostOpener(package, "onnx") as opener:
        report = SelfTest(package, opener, runs=1, core_masks=[], say=lambda line: None,
                          report_path=tmp_path / "report.json").run()
    assert report["passed"], json.dumps(report, default=str)[:2000]
    assert [stream["passed"] for stream in report["end_to_end"]] == [True]


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
