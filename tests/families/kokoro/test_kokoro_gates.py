"""Kokoro export gates that cannot be fooled (issue #14): every comparison gate judges its whole reference and a
silent or constant one fails in words; each planted fault (the walk's overlap one hop off, one padded frame
unmasked) fails its gate while the real export passes; corrupt user files stop up front in one line, exit 2."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from rkaudio.families.kokoro.export import export
from rkaudio.families.kokoro.graph import CONTEXT, build_module, prepare
from rkaudio.families.kokoro.verdicts import (MIN_PADDED_DB, RANDOM_WINDOW_EXPORT_DB, SPEC_PHASE_FULL_SCALE,
                                                 padded_verdict, reference_verdict, spec_verdict, walk_verdict)
from rkaudio.core.errors import GateFailure, SetupError
from rkaudio.board.numeric import DEGENERATE_ADVICE
from rkaudio.board import kokoro as kokoro_walk

from tests.kokoro_small import FRAMES, SMALL, small_job, taps_model, voice_dir

SILENT = "the reference output is silent: the checkpoint or the inputs make the model output zeros"


def with_conv_post(state: dict, bias: float) -> dict:
    """`state` with conv_post's weight zeroed (its weight-norm gain g = 0) and its bias `bias`: the generator
    outputs that constant."""
    state = dict(state)
    state["conv_post.weight_g"] = torch.zeros_like(state["conv_post.weight_g"])
    state["conv_post.bias"] = torch.full_like(state["conv_post.bias"], bias)
    return state


@pytest.fixture(scope="module")
def graph(state):
    return prepare(build_module(SMALL, state), "round", True)


# ---- degenerate references --------------------------------------------------------------------------------

def test_spec_verdict_judges_the_whole_reference():
    """All-zero, constant, 1e-9 noise and NaN references fail with the reason; a real reference with one silent
    window passes with its figure, and so does a gate whose compared columns are quiet but whose whole decode
    is not (`whole`)."""
    rng = np.random.default_rng(0)
    real = rng.standard_normal((1, 22, 3841)) * 2
    test = real + 1e-6 * rng.standard_normal(real.shape)
    cases = {"zeros": (np.zeros_like(real), SILENT), "constant": (np.full_like(real, 0.25), "constant (0.25)"),
             "1e-9 noise": (1e-9 * rng.standard_normal(real.shape), f"below 1e-06 of full scale {SPEC_PHASE_FULL_SCALE:g}"),
             "NaN": (np.where(np.arange(real.shape[-1]) == 7, np.nan, real), "22 non-finite")}  # one column
    for name, (reference, words) in cases.items():
        verdict = spec_verdict("gate", reference, test, 100.0)
        assert not verdict.passed and math.isnan(verdict.value) and words in verdict.detail, (name, verdict.line())
    one_silent_window = real.copy()
    one_silent_window[..., : 60 * 8] = 0  # a quiet first window of a real decode is not a silent checkpoint
    verdict = spec_verdict("gate", one_silent_window, one_silent_window + 1e-6, 100.0)
    assert verdict.passed and verdict.value > 100, verdict.line()
    quiet_columns = np.zeros_like(real[..., :600])
    assert spec_verdict("gate", quiet_columns, quiet_columns, 100.0, whole=real).passed
    assert not spec_verdict("gate", real[..., :600], real[..., :600], 100.0, whole=np.zeros_like(real)).passed


@pytest.mark.parametrize("bias, words", [(0.0, SILENT), (0.5, "the reference output is constant (0.5)")])
def test_silent_or_constant_checkpoint_fails_the_padded_and_reference_gates_in_words(state, bias, words):
    """conv_post zeroed (a checkpoint saved without it): both sides match exactly, and the gates still fail."""
    bad = with_conv_post(state, bias)
    module = build_module(SMALL, bad)
    padded = padded_verdict(SMALL, prepare(module, "round", True), FRAMES, FRAMES - 2 * CONTEXT)
    reference = reference_verdict(SMALL, bad, module, FRAMES)
    for verdict in (padded, reference):
        assert not verdict.passed and math.isnan(verdict.value) and words in verdict.detail, verdict.line()


def test_export_of_a_silent_checkpoint_stops_with_the_silent_reference_message(state, tmp_path):
    """Every comparison gate of the export (ONNX vs torch, padded, walk) fails in words, not at "inf dB"."""
    with pytest.raises(GateFailure) as failure:
        export(small_job(tmp_path), SMALL, with_conv_post(state, 0.0), "random", "round")
    assert [v.name for v in failure.value.verdicts] == ["onnx_vs_torch", "padded_vs_unpadded", "walk_vs_windows"]
    assert all(math.isnan(v.value) and SILENT in v.detail for v in failure.value.verdicts)
    assert failure.value.advice == DEGENERATE_ADVICE and SILENT in str(failure.value)



def test_check_on_a_silent_model_stops_with_the_silent_reference_message(state, exported, tmp_path):
    """`convert check kokoro` judges the model's own decode before rendering anything: a silent one stops it."""
    from typer.testing import CliRunner

    from rkaudio.cli import _register_all, app

    model = taps_model(tmp_path / "silent.onnx", with_conv_post(state, 0.0), FRAMES + 8)
    _register_all()
    result = CliRunner().invoke(app, ["check", "kokoro", str(exported[0].onnx), "--model-onnx", str(model),
                                      "--voice-dir", str(voice_dir(tmp_path / "voice")), "--out",
                                      str(tmp_path / "kokoro.wav")])
    failure = result.exception
    assert isinstance(failure, GateFailure) and [v.name for v in failure.verdicts] == ["engine_walk_vs_model"]
    assert SILENT in str(failure) and not (tmp_path / "kokoro.wav").exists()


# ---- planted faults: the walk's overlap one hop off ---------------------------------------------------------

REAL_PLAN, REAL_WALK, REAL_FEEDS = kokoro_walk.plan_windows, kokoro_walk.walk, kokoro_walk.window_feeds


def plan_shifted(frames: int):
    """The walk's plan with every window after the first starting to emit `frames` frames off: -1 overlaps the
    previous window by one hop more than the walk blends, +1 leaves a one-hop gap."""
    def plan(length, window, context, emitted):
        return [win if win.index == 0 else dataclasses.replace(win, emit_start=win.emit_start + frames)
                for win in REAL_PLAN(length, window, context, emitted)]
    return plan


def walk_at_overlap_one_off(backend, x, har, style, layout, full_decode=None):
    """The runtime walking at an overlap one frame off the plan's (one more, or one less at the widest)."""
    widest = min(layout.context, layout.emitted - 1)
    overlap = layout.overlap + 1 if layout.overlap < widest else layout.overlap - 1
    return REAL_WALK(backend, x, har, style, dataclasses.replace(layout, overlap=overlap), full_decode)


WALK_FAULTS = {"windows overlap one hop more than the walk blends": ("plan_windows", plan_shifted(-1)),
               "a one-hop gap between windows": ("plan_windows", plan_shifted(+1)),
               "the walk at an overlap one frame off the plan": ("walk", walk_at_overlap_one_off)}


@pytest.mark.parametrize("fault", list(WALK_FAULTS))
def test_walk_gate_fails_on_the_overlap_one_hop_off(exported, graph, monkeypatch, fault):
    record, contract, utterance, label = exported
    real = next(v for v in record.verdicts if v.name == "walk_vs_windows")
    assert real.passed and real.threshold <= RANDOM_WINDOW_EXPORT_DB, real.line()  # or the floor's (121.0 - 10)
    name, planted = WALK_FAULTS[fault]
    monkeypatch.setattr(kokoro_walk, name, planted)
    verdict = walk_verdict(graph, record.reference, utterance, contract, label, RANDOM_WINDOW_EXPORT_DB)
    assert not verdict.passed and verdict.value < real.value - 40, (fault, verdict.line(), real.line())


# ---- planted fault: one padded frame unmasked ---------------------------------------------------------------

def feeds_with_one_padded_frame_unmasked(x, har, style, start, layout):
    """The runtime's window feeds with the masks marking the first padded frame as real."""
    feeds = REAL_FEEDS(x, har, style, start, layout)
    real = min(layout.window, x.shape[-1] - start)
    feeds["mask_coarse"][..., : layout.coarse_hop * (real + 1)] = 1
    feeds["mask_fine"][..., : layout.hop * (real + 1) + 1] = 1
    return feeds


@pytest.mark.parametrize("real_frames", [FRAMES - 2 * CONTEXT, 21])
def test_padded_gate_fails_with_one_padded_frame_unmasked(graph, monkeypatch, real_frames):
    real = padded_verdict(SMALL, graph, FRAMES, real_frames)
    assert real.passed and real.threshold == MIN_PADDED_DB, real.line()
    monkeypatch.setattr(kokoro_walk, "window_feeds", feeds_with_one_padded_frame_unmasked)
    verdict = padded_verdict(SMALL, graph, FRAMES, real_frames)
    assert not verdict.passed and verdict.value < 100, verdict.line()


# ---- corrupt inputs up front: one line naming the file, exit 2 ----------------------------------------------

def convert(monkeypatch, capsys, *args) -> str:
    """`convert ARGS` through the CLI's main; asserts exit 2 and one clean line, returns it."""
    from rkaudio import cli

    monkeypatch.setattr("sys.argv", ["convert", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def nan_weight_onnx(source, path):
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    largest = max(model.graph.initializer, key=lambda init: int(np.prod(init.dims)))
    values = numpy_helper.to_array(largest).copy()
    values.flat[3] = np.nan
    largest.CopyFrom(numpy_helper.from_array(values, largest.name))
    onnx.save(model, str(path))
    return largest.name


def test_corrupt_model_onnx_is_refused_up_front(exported, tmp_path, monkeypatch, capsys):
    """`--model-onnx` truncated, a text file, a NaN weight (named), and an ONNX that is not kokoro-onnx."""
    engine = exported[0].onnx
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(engine.read_bytes()[: engine.stat().st_size // 2])
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    nan = tmp_path / "nan.onnx"
    tensor = nan_weight_onnx(engine, nan)
    for path, words in ((truncated, "not a readable kokoro ONNX model"), (text, "not a readable kokoro ONNX model"),
                        (nan, f"constant '{tensor}' holds 1 NaN/Inf"), (engine, "has no generator conv_post")):
        line = convert(monkeypatch, capsys, "kokoro", "--model-onnx", path, "--skip-rknn", "--out", tmp_path / "out")
        assert str(path) in line and words in line, line


def test_corrupt_checkpoint_is_refused_up_front(state, tmp_path, monkeypatch, capsys):
    """`--checkpoint`: a truncated kokoro-v1_0.pth, a config.json that is not JSON or not a Kokoro config, and a
    checkpoint with a NaN generator weight (named)."""
    config = {"style_dim": 8, "istftnet": {"upsample_initial_channel": 16, "upsample_rates": [10, 6],
              "upsample_kernel_sizes": [20, 12], "resblock_kernel_sizes": [3, 7, 11],
              "resblock_dilation_sizes": [[1, 3, 5]] * 3, "gen_istft_n_fft": 20, "gen_istft_hop_size": 5}}
    good = tmp_path / "good"
    good.mkdir()
    (good / "config.json").write_text(json.dumps(config))
    torch.save({"decoder": {f"module.generator.{k}": v for k, v in state.items()}}, str(good / "kokoro-v1_0.pth"))
    whole = (good / "kokoro-v1_0.pth").read_bytes()
    cases = []
    for name, config_text, checkpoint in (
            ("truncated", json.dumps(config), whole[: len(whole) // 2]),
            ("not_json", "{\"style_dim\": 8,", whole),
            ("not_kokoro", json.dumps({"style_dim": 8}), whole)):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "config.json").write_text(config_text)
        (directory / "kokoro-v1_0.pth").write_bytes(checkpoint)
        cases.append(directory)
    nan_dir = tmp_path / "nan"
    nan_dir.mkdir()
    (nan_dir / "config.json").write_text(json.dumps(config))
    broken = dict(state)
    broken["conv_post.bias"] = torch.full_like(state["conv_post.bias"], math.inf)
    torch.save({"decoder": {f"module.generator.{k}": v for k, v in broken.items()}}, str(nan_dir / "kokoro-v1_0.pth"))
    expected = [(cases[0] / "kokoro-v1_0.pth", "not a readable PyTorch checkpoint"),
                (cases[1] / "config.json", "not a readable JSON file"),
                (cases[2] / "config.json", "not a Kokoro config.json"),
                (nan_dir / "kokoro-v1_0.pth", "tensor generator.conv_post.bias holds 22 NaN/Inf")]
    for (path, words), directory in zip(expected, [*cases, nan_dir]):
        line = convert(monkeypatch, capsys, "kokoro", "--checkpoint", directory, "--skip-rknn", "--out",
                       tmp_path / "out")
        assert str(path) in line and words in line, line


def test_corrupt_voice_files_and_models_are_refused_up_front_by_the_check(exported, tmp_path, monkeypatch, capsys):
    """`convert check kokoro`: vocab.json not JSON or without its map, voices_ja.npz not an .npz or a voice of
    another shape, an unknown voice, a truncated engine ONNX, and a --model-onnx that is not kokoro-onnx."""
    engine = exported[0].onnx
    truncated = tmp_path / "engine.onnx"
    truncated.write_bytes(engine.read_bytes()[:1000])
    good = voice_dir(tmp_path / "good")
    cases = [
        (engine, voice_dir(tmp_path / "a", vocab_text="{'vocab':"), [], "vocab.json", "not a readable JSON file"),
        (engine, voice_dir(tmp_path / "b", vocab_text="[1, 2]"), [], "vocab.json", "no \"vocab\" map"),
        (engine, voice_dir(tmp_path / "c", voices="not an npz"), [], "voices_ja.npz", "not a readable .npz"),
        (engine, voice_dir(tmp_path / "d", voices={"jf_alpha": np.zeros((510, 256), np.float32)}), [],
         "voices_ja.npz", "voice 'jf_alpha' is float32[510, 256]"),
        (engine, good, ["--voice", "jf_nobody"], "voices_ja.npz", "no voice 'jf_nobody'"),
        (truncated, good, [], "engine.onnx", "not a readable Kokoro engine ONNX"),
        (engine, good, [], engine.name, "has no generator tensor"),
    ]
    for onnx_path, directory, extra, named, words in cases:
        line = convert(monkeypatch, capsys, "check", "kokoro", onnx_path, "--voice-dir", directory,
                       "--model-onnx", engine, "--out", tmp_path / "out", *extra)
        assert named in line and words in line, line
