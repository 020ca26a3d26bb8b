"""`convert build MODEL.onnx --window W` (issue #45) on vocoders that are no family of rkaudio, at the reduced configs
of tests/speech_models.py exported with a dynamic time axis, through the `convert` app as a user types it: the
measured context and window contract in the engine, the walk rendered by `convert check vocoder` on both backends, a
package's walk golden replayed by `convert selftest`, `--window auto`, Wav2Vec2 refused for its attention, and the
walk gates failing on a context too short and on a frame mask left out."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.convert_app import convert, output
from tests.speech_models import export

VOCODERS = ("speecht5_hifigan", "mms_tts_decoder", "dac_decoder")


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory) -> dict[str, Path]:
    """The three vocoders and the Wav2Vec2 encoder, reduced, exported with their time axis dynamic."""
    folder = tmp_path_factory.mktemp("dynamic_speech_models")
    return {name: export(name, folder / f"{name}.onnx", "reduced", dynamic_time=True)
            for name in (*VOCODERS, "wav2vec2_encoder")}


def manifest_of(out: Path) -> dict:
    (path,) = out.glob("*.manifest.json")
    return json.loads(path.read_text())


def build_window(onnx_path: Path, window: str, target: str, out: Path):
    """`convert build ONNX --window WINDOW --target TARGET --fix --out OUT`, passed: (the process, its manifest)."""
    built = convert("build", str(onnx_path), "--window", window, "--target", target, "--fix", "--out", str(out))
    assert built.returncode == 0, output(built)
    return built, manifest_of(out)


def assert_clean_window_engine(manifest: dict) -> None:
    """Every gate passed, 0 REGTASK lines, 0 CPU ops, and the context the smallest that held the interior bar."""
    assert all(gate["passed"] for gate in manifest["gates"]), [g for g in manifest["gates"] if not g["passed"]]
    assert manifest["regtask"]["lines"] == 0 and manifest["ops"]["cpu"] == 0, manifest["ops"]["cpu_ops"]
    contract = manifest["contract"]
    searched = {int(c): float(db) for c, db in contract["context_search_db"].items()}  # "inf": an exact match
    assert searched[contract["context"]] >= 90.0 and all(db < 90.0 for c, db in searched.items()
                                                         if c < contract["context"]), searched
    assert contract["emitted"] == contract["window"] - 2 * contract["context"]


def test_a_mel_vocoder_is_built_for_a_window_checked_through_the_walk(tmp_path, dynamic):
    out = tmp_path / "out"
    _, manifest = build_window(dynamic["speecht5_hifigan"], "64", "rk3588", out)
    assert_clean_window_engine(manifest)
    contract = manifest["contract"]
    # the mel is [1, frames, 80]: its time axis (1) found as the one dynamic axis, and stored for the walk
    assert (contract["time_axis"], contract["latent_input"], contract["mask_input"]) == (1, "mel", "mask")
    assert contract["window"] == 64 and contract["hop"] == 256 and contract["family"] == "vocoder"
    index = json.loads((out / "selftest" / "index.json").read_text())
    assert [e["loop"] for e in index["end_to_end"]] == ["rkaudio.board.window_walk:golden_loop"]

    engine = out / "speecht5_hifigan_w64.onnx"
    for backend in ("onnx", "simulator"):
        wav = tmp_path / backend / "v.wav"
        checked = convert("check", "vocoder", "--model", str(dynamic["speecht5_hifigan"]), "--engine", str(engine),
                          "--backend", backend, "--frames", "200", "--out", str(wav))
        assert checked.returncode == 0, output(checked)
        windowing = re.search(r"vs full-length reference \(the windowing alone\): (\S+) dB", checked.stdout)
        engine_db = re.search(r"engine render vs fp32 render: (\S+) dB overall", checked.stdout)
        assert float(windowing.group(1)) >= 90.0 and 35.0 < float(engine_db.group(1)), checked.stdout[-2000:]
        assert all((tmp_path / backend / name).is_file() for name in ("v.wav", "v.fp32.wav", "v.full.wav", "v.png"))


def test_a_snake_vocoder_on_rk3566_keeps_nothing_on_the_cpu(tmp_path, dynamic):
    _, manifest = build_window(dynamic["dac_decoder"], "64", "rk3566", tmp_path / "out")
    assert_clean_window_engine(manifest)
    gates = {gate["name"]: gate for gate in manifest["gates"]}
    # the round-form sine approximates: the walk of its graph is held to the pass's own bar, and says so
    assert "fix:sine_polynomial" in gates and "sine_polynomial's bar" in gates["interior_snr_min"]["detail"]


def test_window_auto_keeps_the_fewest_predicted_ms_per_emitted_frame(tmp_path, dynamic):
    built, manifest = build_window(dynamic["mms_tts_decoder"], "auto", "rk3576", tmp_path / "out")
    priced = {int(w): float(ms) for w, ms in re.findall(r"window (\d+): ([\d.]+) predicted board ms per emitted",
                                                        built.stdout)}
    assert set(priced) == {64, 128, 256}, built.stdout[-3000:]
    chosen = min(priced, key=priced.get)
    assert manifest["contract"]["window"] == chosen and f"--window auto: {chosen} for rk3576" in built.stdout
    assert_clean_window_engine(manifest)


def test_wav2vec2_is_refused_naming_its_attention(tmp_path, dynamic):
    out = tmp_path / "out"
    refused = convert("build", str(dynamic["wav2vec2_encoder"]), "--window", "3200", "--target", "rk3588",
                      "--out", str(out))
    assert refused.returncode == 2, output(refused)
    assert "no finite context along audio axis 1: attention" in refused.stderr, refused.stderr
    assert "/wav2vec2/encoder/layers.0/attention/" in refused.stderr, refused.stderr
    assert not out.exists() or not list(out.iterdir())


def test_a_context_too_short_fails_the_interior_gate(tmp_path, dynamic):
    result = convert("vocoder", "--model", str(dynamic["mms_tts_decoder"]), "--context", "4", "--skip-rknn",
                     "--out", str(tmp_path))
    assert result.returncode == 3, output(result)
    assert re.search(r"\[FAIL\] interior_snr_min: [\d.]+ dB \(threshold 90\)", result.stdout + result.stderr)


def test_a_frame_mask_left_out_fails_the_tail_gate(tmp_path, dynamic, monkeypatch):
    """A planted fault: the mask input is added but no conv output is multiplied by it, so a short latent's padding
    leaks into its real frames, as a decoder without the mask does."""
    from rkaudio.families.vocoder import FAMILY
    from rkaudio.families.vocoder.export import export_window
    from rkaudio.surgery.graph import mask

    monkeypatch.setattr(mask, "mask_decoder", lambda model, decoder_input, mask_name: model)
    job = FAMILY.job(target="rk3588", out=tmp_path, source={"model": str(dynamic["mms_tts_decoder"])})
    written = export_window(job, dynamic["mms_tts_decoder"], 64, tmp_path, say=lambda line: None)
    failed = {v.name for v in written.verdicts if not v.passed}
    assert failed == {"tail_snr[16]", "tail_snr[48]"}, [v.line() for v in written.verdicts]


def test_a_package_of_a_walked_vocoder_replays_its_walk_golden(tmp_path, dynamic):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "mms_window.toml").write_text(
        'package = "mms_window"\nfamily = "vocoder"\ntargets = ["rk3576"]\n\n'
        f'[source]\nmodel = "{dynamic["mms_tts_decoder"]}"\n\n[options]\nwindow = 64\nsample_rate = 16000\n'
        'fix = true\n\n[gates]\nmax_regtask_lines = 0\nfail_on_cpu_ops = true\n')
    dist = tmp_path / "dist"
    built = convert("engines", "--target", "rk3576", "--recipes", str(recipes), "--dist", str(dist))
    assert built.returncode == 0, output(built)
    package = dist / "rk3576" / "mms_window_rk3576"
    replayed = convert("selftest", str(package), "--backend", "onnx", "--report", str(tmp_path / "report.json"))
    assert replayed.returncode == 0, output(replayed)
    assert "e2e mms_tts_decoder_w64_walk" in replayed.stdout and "every gate passed" in replayed.stdout
    verified = convert("verify", str(package))
    assert verified.returncode == 0, output(verified)


def test_a_window_whose_last_frames_never_reach_the_decoder_fails_the_last_window_gate(tmp_path, dynamic,
                                                                                          monkeypatch):
    """A planted fault: the engine graph zeroes its window's last 5 latent frames (a slice that drops the window's
    end). At a context of 20 no interior window emits within the decoder's reach of them, and the short latents'
    padding is zero already, so only the window that emits up to the latent's end shows it."""
    import importlib

    from onnx import helper, numpy_helper

    from rkaudio.families.vocoder import FAMILY

    # the module, not the package's `export` function of the same name
    window_export = importlib.import_module("rkaudio.families.vocoder.export")

    exact = window_export.windowed_graph

    def end_dropped(model, axis, window, tail_mask):
        graph = exact(model, axis, window, tail_mask)
        keep = np.ones((1, 1, window), np.float32)
        keep[..., -5:] = 0.0
        for node in graph.graph.node:
            node.input[:] = ["latent_kept" if name == axis.input else name for name in node.input]
        graph.graph.initializer.append(numpy_helper.from_array(keep, "end_dropped"))
        graph.graph.node.insert(0, helper.make_node("Mul", [axis.input, "end_dropped"], ["latent_kept"]))
        return graph

    monkeypatch.setattr(window_export, "windowed_graph", end_dropped)
    job = FAMILY.job(target="rk3588", out=tmp_path, source={"model": str(dynamic["mms_tts_decoder"])},
                     options={"context": 20})
    written = window_export.export_window(job, dynamic["mms_tts_decoder"], 64, tmp_path, say=lambda line: None)
    failed = {v.name for v in written.verdicts if not v.passed}
    assert failed == {"last_window_snr"}, [v.line() for v in written.verdicts]
