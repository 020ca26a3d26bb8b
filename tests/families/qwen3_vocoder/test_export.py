"""Export (tiny config): contract, ONNX vs torch, export health, and the runtime walks over onnxruntime."""
from __future__ import annotations

import io

import pytest
import torch

from rkaudio.families.qwen3_vocoder import step_export as E
from rkaudio.pipeline.pipeline import Exported
from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG, random_codes
from rkaudio.board.numeric import snr_db
from rkaudio.host.backends import OnnxBackend
from rkaudio.board.qwen3_vocoder import offline_decode, stream_decode, window_decode
from rkaudio.core.contract import contract_of, get_contract

MIN_FP32_DB = 100.0


@pytest.fixture(scope="module")
def exported(tmp_path_factory, step_job, tiny_step, tiny_reference):
    out = tmp_path_factory.mktemp("tiny_export")
    return {role: E.export_step(step_job, tiny_step, frames, role, out / f"{role}.onnx", reference=tiny_reference)
            for role, frames in (("first", 16), ("main", 64), ("window", E.WINDOW_CONTEXT + 12))}


def test_contract_and_export_verdicts(exported, tiny_step):
    for role, result in exported.items():
        assert all(v.passed for v in result.verdicts), [v.line() for v in result.verdicts]
        contract = get_contract(result.onnx)
        assert (contract["family"], contract["component"], contract["role"], contract["exec_plan_option"]) == (
            "qwen3-vocoder", "speech_decoder", role, "qwen3_tts.exec_plan")
        assert contract["cache_numel"] == tiny_step.cache_numel  # the same layout whatever B is
        assert contract["kv_len"] == TINY_CONFIG["sliding_window"] - 1
        assert contract["head_dim"] == TINY_CONFIG["head_dim"]
        # The verdicts travel in the contract: an --onnx build reads back what the export decided.
        assert Exported.from_onnx(result.onnx, "qwen3-vocoder") == result
    backend = OnnxBackend(exported["main"].onnx)
    assert backend.input_names == ["codes", "cache_in"] and backend.output_names == ["pcm", "cache_out"]
    assert get_contract(exported["window"].onnx)["emitted"] == 12


def test_a_contract_from_before_codes_dtype_reads_at_the_defaults(exported):
    """Packages exported before `codes_dtype` (and the sine and row fields) took int64 code ids: their contracts
    read at the defaults, so today's board runtime still feeds them."""
    from rkaudio.board.contract import EngineContract
    from rkaudio.board.qwen3_vocoder import StepContract, WindowRole

    later = ("codes_dtype", "sine_form", "sine_degree", "row_samples_limit")
    main = {key: value for key, value in get_contract(exported["main"].onnx).items() if key not in later}
    step = StepContract.of(EngineContract.from_json(main))
    assert (step.frames, step.codes_dtype, step.sine_form, step.row_samples_limit) == (64, "int64", None, None)
    window = {key: value for key, value in get_contract(exported["window"].onnx).items() if key not in later}
    role = WindowRole.of(EngineContract.from_json(window))
    assert (role.window, role.context, role.emitted, role.codes_dtype) == (E.WINDOW_CONTEXT + 12, E.WINDOW_CONTEXT,
                                                                          12, "int64")


def test_streaming_and_offline_over_onnxruntime(exported, tiny_reference):
    """First group on the B=16 engine, the rest on B=64 (the last group padded), against the package decoder."""
    codes = random_codes(TINY_CONFIG, 150, seed=5)
    with torch.no_grad():
        full = tiny_reference(codes)[0, 0].numpy()
    main, first = OnnxBackend(exported["main"].reference), OnnxBackend(exported["first"].reference)
    main_contract, first_contract = contract_of(exported["main"].onnx), contract_of(exported["first"].onnx)
    streamed, available = stream_decode(codes[0].numpy(), main, main_contract, first, first_contract, event_frames=4)
    samples = get_contract(exported["main"].onnx)["samples_per_frame"]
    assert available[3] == 16 * samples  # audio after the 4th event of 4 frames: the first group of 16
    assert snr_db(full, streamed) > MIN_FP32_DB
    assert snr_db(full, offline_decode(codes[0].numpy(), main, main_contract)) > MIN_FP32_DB


def test_window_role_reproduces_chunked_decode(exported, tiny_reference):
    codes = random_codes(TINY_CONFIG, 100, seed=6)
    contract = get_contract(exported["window"].onnx)
    with torch.no_grad():
        chunked = tiny_reference.chunked_decode(codes, chunk_size=contract["emitted"],
                                                left_context_size=contract["context"])[0, 0].numpy()
        full = tiny_reference(codes)[0, 0].numpy()
    windowed = window_decode(codes[0].numpy(), OnnxBackend(exported["window"].reference),
                             contract_of(exported["window"].onnx))
    vs_chunked, vs_full = snr_db(chunked, windowed), snr_db(full, windowed)
    print(f"window role: {vs_chunked:.1f} dB vs the package chunked_decode, {vs_full:.1f} dB vs its full decode")
    assert vs_chunked > MIN_FP32_DB  # vs_full is reported only: how far it falls depends on the weights


def test_stepwise_gate_fails_on_a_wrong_reference(step_job, tiny_step, tmp_path):
    """The export self-check fails when the step does not decode what the reference decodes."""
    from rkaudio.families.qwen3_vocoder.random_model import random_reference

    other = random_reference(TINY_CONFIG, seed=9, gain=1.0)
    result = E.export_step(step_job, tiny_step, 16, "first", tmp_path / "bad.onnx", reference=other)
    stepwise = [v for v in result.verdicts if v.name.startswith("stepwise_vs_full")]
    assert len(stepwise) == 1 and not stepwise[0].passed


def test_export_health_warns_on_decomposed_layernorm(tmp_path, exported):
    import onnx

    path = tmp_path / "decomposed.onnx"
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    # Opset 16 has no LayerNormalization: the exporter writes it out as ReduceMean/Sub/Pow/Sqrt/Div.
    torch.onnx.export(module, (torch.randn(1, 5, 8),), str(path), dynamo=False, opset_version=16)
    stream = io.StringIO()
    verdict = E.export_health(onnx.load(str(path)), stream)
    assert not verdict.passed and "LayerNorm(decomposed)" in verdict.detail
    assert "warning: export health" in stream.getvalue()
    compact = io.StringIO()
    assert E.export_health(onnx.load(str(exported["main"].onnx)), compact).passed and not compact.getvalue()


def test_sine_form_gate_fails_on_a_clipped_sine(step_job, tiny_step, tmp_path):
    """The sine-form gate compares the engine graph's SnakeBeta sine with the exact one: the clip form (no
    range reduction) is far from it at these arguments and fails; the exact graph is still written beside it."""
    result = E.export_step(step_job, tiny_step, 16, "first", tmp_path / "clip.onnx", sine_form="clip")
    sine = [v for v in result.verdicts if v.name.startswith("sine_form")]
    print(sine[0].line())
    assert len(sine) == 1 and not sine[0].passed
    assert result.reference.is_file() and get_contract(result.reference)["sine_form"] == "exact"


@pytest.fixture(scope="module")
def low_floor_reference():
    """Random weights whose own fp32 decode is under 80 dB from float64 (Snake spread 1.3: 79.2 dB over the
    first-role self-check codes), as a real checkpoint's dynamic range can leave it: no two fp32 computations of
    these weights agree to 80 dB, so a fixed 80 dB gate would refuse a faithful export."""
    from rkaudio.families.qwen3_vocoder.reference import randomize_, reference_decoder

    torch.manual_seed(0)
    return randomize_(reference_decoder(TINY_CONFIG), random_codes(TINY_CONFIG, 24, 0), seed=0, gain=1.0, spread=1.3)


def _planted_weight_fault(monkeypatch):
    """Plant: the traced graph's largest initializer off by 1% in one element, as a broken rewrite would leave it."""
    import numpy as np
    from onnx import numpy_helper

    import rkaudio.surgery.graph.fold as fold

    folded = fold.fold_fixed

    def fold_with_fault(model):
        model = folded(model)
        largest = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
        values = numpy_helper.to_array(largest).copy()
        values.flat[0] *= 1.01
        largest.CopyFrom(numpy_helper.from_array(values, largest.name))
        return model

    monkeypatch.setattr(fold, "fold_fixed", fold_with_fault)


@pytest.mark.parametrize("role, frames", [("first", 16), ("window", E.WINDOW_CONTEXT + 12)])
def test_onnx_gate_follows_the_weights_fp32_floor_and_still_catches_a_planted_fault(
        step_job, low_floor_reference, tmp_path, monkeypatch, role, frames):
    from rkaudio.families.qwen3_vocoder.random_model import step_of

    step = step_of(low_floor_reference, TINY_CONFIG)
    record = E.export_step(step_job, step, frames, role, tmp_path / "faithful.onnx", reference=low_floor_reference,
                           sine_form="exact")  # the sine form's own gate judges an approximation, not rounding
    gates = {v.name: v for v in record.verdicts if v.name.startswith("onnx_vs_torch")}
    assert all(v.passed for v in record.verdicts), [v.line() for v in record.verdicts]
    pcm = gates["onnx_vs_torch[pcm, exact sine]"]
    print(pcm.line())
    assert pcm.threshold < E.MIN_ONNX_SNR_DB and pcm.value < E.MIN_ONNX_SNR_DB, pcm.line()  # the old gate: a FAIL
    _planted_weight_fault(monkeypatch)
    planted = E.export_step(step_job, step, frames, role, tmp_path / "planted.onnx",
                            reference=low_floor_reference, sine_form="exact")
    failed = [v for v in planted.verdicts if not v.passed]
    assert [v.name for v in failed][:1] == ["onnx_vs_torch[pcm, exact sine]"], [v.line() for v in planted.verdicts]
