"""Every command that `convert --help` and `convert check --help` list, run as a user types it: the installed
console script (tests/convert_app.py), each with the smallest input that does real work (a random-init model, the
family's test model, `--only example_conv`, `publish --dry-run`) and every other option at its default, asserting
on what it wrote and printed. `test_every_listed_command_has_a_run` fails when a command has no run here.

The runs work in a scratch folder (`work/` lands there). The runs of the real voices (the joe Piper voice, the packaged
Kokoro model: what `convert piper` and the checks of Piper and Kokoro take by default) are `slow`, as is every test that
loads a real checkpoint; the rest take a minute or two together."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from tests.convert_app import SCRIPTS, convert, output
from tests.real_checkpoints import real_checkpoint
from rkaudio.toolkit.versions import DEFAULT_TOOLKIT, converter_python

RUNS: dict[str, str] = {}  # command as typed after `convert` -> the test that runs it


def runs(command: str):
    """Marks a test as the run of `convert COMMAND` (e.g. "check piper")."""
    def mark(test):
        RUNS[command] = test.__name__
        return test
    return mark


def listed_commands(*group: str) -> set[str]:
    """The command names the real `convert [GROUP] --help` lists in its Commands panel."""
    result = convert(*group, "--help")
    assert result.returncode == 0, output(result)
    panel = result.stdout.split("Commands", 1)[1]
    names = set()
    for line in panel.splitlines()[1:]:
        match = re.match(r"^│ (\S+)\s{2,}", line)  # a continuation line starts with spaces, not a name
        if match:
            names.add(match.group(1))
    return names


def overall_snr(stdout: str) -> float:
    match = re.search(r"engine render vs fp32 render: (\S+) dB overall", stdout)
    assert match, stdout[-3000:]
    return float(match.group(1))


FP16_ESTIMATE = "onnxruntime, every tensor rounded to fp16: the fp16 estimate"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """The folder the runs work in: the defaults' `work/` and `selftest-report.json` land here. The default
    converter venv must exist (`make test` creates it): a missing one fails here, never skips."""
    converter_python(DEFAULT_TOOLKIT)
    return tmp_path_factory.mktemp("convert_runs")


def run(scratch: Path, *args: str):
    """`convert ARGS` in the scratch folder; asserts it succeeded and returns the finished process."""
    result = convert(*args, cwd=scratch)
    assert result.returncode == 0, output(result)
    return result


# ---- the list ------------------------------------------------------------------------------------------------

def test_every_listed_command_has_a_run():
    """`convert --help` and `convert check --help` list exactly the commands this module runs."""
    listed = {name for name in listed_commands() if name != "check"}
    listed |= {f"check {name}" for name in listed_commands("check")}
    assert listed == set(RUNS), (f"listed but not run here: {sorted(listed - set(RUNS))}; run here but not "
                                 f"listed: {sorted(set(RUNS) - listed)}")


@pytest.mark.parametrize("name", SCRIPTS)
def test_both_console_scripts_run_the_same_app(name):
    result = convert("--help", script_name=name)
    assert result.returncode == 0, output(result)
    assert f"Usage: {name} " in result.stdout and "check" in result.stdout and "engines" in result.stdout


# ---- the commands that are not a family's --------------------------------------------------------------------

@pytest.fixture(scope="module")
def example_export(scratch) -> Path:
    """`convert example --skip-rknn`: the example family's ONNX at its default frames, into work/example/."""
    result = run(scratch, "example", "--skip-rknn")
    onnx_files = sorted((scratch / "work" / "example").glob("*.onnx"))
    assert onnx_files, output(result)
    return onnx_files[0]


@runs("example")
def test_example(scratch):
    result = run(scratch, "example", "--out", str(scratch / "example_built"))
    engines = sorted((scratch / "example_built").glob("*.rknn"))
    assert engines and all(e.with_suffix(".manifest.json").is_file() for e in engines), output(result)
    assert "FAIL" not in result.stdout and "simulator_snr" in result.stdout


@pytest.fixture(scope="module")
def built_engine(scratch, example_export) -> Path:
    result = run(scratch, "build", str(example_export), "--target", "rk3588", "--out", str(scratch / "built"))
    engine = scratch / "built" / example_export.with_suffix(".rknn").name
    assert engine.is_file() and f"wrote {engine}" in result.stdout, output(result)
    return engine


@runs("build")
def test_build(built_engine):
    manifest = json.loads(built_engine.with_suffix(".manifest.json").read_text())
    assert manifest["target"] == "rk3588" and manifest["regtask"]["lines"] == 0
    assert all(gate["passed"] for gate in manifest["gates"])


@runs("doctor")
def test_doctor(scratch):
    from tests.speech_models import export

    hifigan = export("speecht5_hifigan", scratch / "hifigan.onnx", "reduced", dynamic_time=True)
    result = run(scratch, "doctor", str(hifigan), "--target", "rk3566", "--shape", "mel=1,100,80")
    assert "doctor, rk3566 (rknn-toolkit2 2.3.2):" in result.stdout and "long_axis" in result.stdout
    assert "axis 25,600 = 3.13x the 0x1fff field [fix: polyphase]" in result.stdout


@runs("inspect")
def test_inspect(scratch, built_engine):
    result = run(scratch, "inspect", str(built_engine))
    assert f"{built_engine.name}: " in result.stdout and "for rk3588" in result.stdout and "gates:" in result.stdout


@runs("diagnose")
def test_diagnose(scratch, example_export):
    result = run(scratch, "diagnose", str(example_export), "--target", "rk3588")
    pngs = list(example_export.parent.glob("*.png"))
    assert pngs and "Conv" in result.stdout, output(result)


@pytest.fixture(scope="module")
def package(scratch) -> Path:
    """`convert engines --target rk3588 --only example_conv`, into a dist folder of the scratch."""
    dist = scratch / "dist"
    result = run(scratch, "engines", "--target", "rk3588", "--only", "example_conv", "--dist", str(dist))
    built = dist / "rk3588" / "example_conv_rk3588"
    assert (built / "SHA256SUMS").is_file() and "example_conv" in result.stdout, output(result)
    return built


@runs("engines")
def test_engines(package):
    assert sorted(p.name for p in package.glob("*.rknn")) and (package / "exec_plan.json").is_file()


@runs("selftest")
def test_selftest(scratch, package):
    result = run(scratch, "selftest", str(package))
    assert "every gate passed" in result.stdout, output(result)
    report = json.loads((scratch / "selftest-report.json").read_text())
    assert report["passed"] and report["backend"].startswith("simulator")
    assert not list(package.glob("*report*"))


def test_selftest_of_a_folder_that_is_no_package_writes_no_report(scratch):
    """Refused for its missing SHA256SUMS, and nothing is written beside it or in the working directory."""
    folder = scratch / "not_a_package"
    folder.mkdir()
    for cwd in (folder, scratch / "elsewhere"):
        cwd.mkdir(exist_ok=True)
        before = set(scratch.rglob("*"))
        result = convert("selftest", str(folder), "--backend", "onnx", cwd=cwd)
        assert result.returncode == 2 and "no SHA256SUMS" in result.stdout, output(result)
        assert "no report written" in result.stdout and set(scratch.rglob("*")) == before


def test_selftest_writes_no_report_inside_a_package(scratch, package):
    result = convert("selftest", str(package), "--backend", "onnx", "--report", str(package / "r.json"), cwd=scratch)
    assert result.returncode == 2 and "inside the package" in result.stdout, output(result)
    assert not (package / "r.json").exists()


@runs("verify")
def test_verify(scratch, package):
    result = run(scratch, "verify", str(package))
    assert "every file matches SHA256SUMS and the manifests" in result.stdout


@runs("publish")
def test_publish(scratch, package):
    result = run(scratch, "publish", str(package.parent), "--repo-id", "rkaudio-test/example", "--dry-run")
    assert "example_conv_rk3588" in result.stdout and "SHA256SUMS" in result.stdout, output(result)


@runs("aperture")
def test_aperture(scratch):
    """CosyVoice3's own tool reads a package's manifests (here written by hand: no engine needed)."""
    from tests.fake_cosyvoice3_package import fake_package

    package_dir = fake_package(scratch / "cosyvoice3_pkg", {110: 20, 200: 60, 500: 50_000}, plan=[110, 200, 500])
    result = run(scratch, "aperture", str(package_dir))
    lines = result.stdout.splitlines()
    assert any(line.split()[0] == "500" and "REFUSED" in line for line in lines[2:5]), result.stdout
    assert "spec admitted 110+200+250" in result.stdout and "rung set(s) fit 3900 MiB" in result.stdout
    missing = convert("aperture", str(scratch / "none"), cwd=scratch)
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: no package at {scratch / 'none'}"


# ---- the families: export, then check -----------------------------------------------------------------------

@pytest.fixture(scope="module")
@real_checkpoint
def piper_export(scratch) -> Path:
    """`convert piper --skip-rknn`: the packaged joe voice's decoder slice at the default window."""
    run(scratch, "piper", "--skip-rknn")
    (onnx_path,) = [p for p in (scratch / "work" / "piper").glob("*.onnx") if not p.name.endswith(".fp32.onnx")]
    return onnx_path


@pytest.mark.slow
@runs("piper")
def test_piper(piper_export):
    assert piper_export.with_suffix(".selfcheck.npz").is_file()


@pytest.mark.slow
@runs("check piper")
def test_check_piper(scratch):
    """The default backend is the fp16 estimate: a finite SNR, never the graph against itself."""
    result = run(scratch, "check", "piper", "--text", "Hello there.")
    assert FP16_ESTIMATE in result.stdout
    assert 20.0 < overall_snr(result.stdout) < math.inf
    assert (scratch / "work" / "piper" / "check.wav").is_file()


@pytest.fixture(scope="module")
def kokoro_small(scratch):
    """The small random-init Kokoro generator as a checkpoint folder, a stand-in kokoro-onnx model with its
    seam tensors, and a voice folder (tests/kokoro_small.py)."""
    import torch

    from tests.kokoro_small import SMALL, small_reference, taps_model, voice_dir

    _, state = small_reference()
    checkpoint = scratch / "kokoro_checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(
        {"style_dim": SMALL.style_dim, "istftnet": {
            "upsample_initial_channel": SMALL.upsample_initial_channel, "upsample_rates": [10, 6],
            "upsample_kernel_sizes": [20, 12], "resblock_kernel_sizes": [3, 7, 11],
            "resblock_dilation_sizes": [[1, 3, 5]] * 3, "gen_istft_n_fft": 20, "gen_istft_hop_size": 5}}))
    torch.save({"decoder": {f"module.generator.{k}": v for k, v in state.items()}}, str(checkpoint / "kokoro-v1_0.pth"))
    return {"checkpoint": checkpoint, "model": taps_model(scratch / "kokoro-taps.onnx", state, 80),
            "voices": voice_dir(scratch / "kokoro_voices")}


@runs("kokoro")
def test_kokoro(scratch, kokoro_small):
    from tests.kokoro_small import FRAMES

    out = scratch / "kokoro_export"
    run(scratch, "kokoro", "--checkpoint", str(kokoro_small["checkpoint"]), "--frames", str(FRAMES), "--skip-rknn",
        "--out", str(out))
    engine = out / f"kokoro_generator_w{FRAMES}.onnx"
    assert engine.is_file() and engine.with_suffix(".fp32.onnx").is_file()
    result = run(scratch, "check", "kokoro", str(engine), "--model-onnx", str(kokoro_small["model"]), "--voice-dir",
                 str(kokoro_small["voices"]), "--out", str(scratch / "kokoro_small.wav"))
    assert FP16_ESTIMATE in result.stdout and 20.0 < overall_snr(result.stdout) < math.inf


@pytest.mark.slow
@runs("check kokoro")
def test_check_kokoro(scratch):
    """With no option at all: the packaged int8 Kokoro model and the packaged voices (exported at the recipe's
    frames, about half a minute)."""
    result = run(scratch, "check", "kokoro")
    assert FP16_ESTIMATE in result.stdout and 25.0 < overall_snr(result.stdout) < math.inf
    assert (scratch / "work" / "kokoro" / "check.png").is_file()


@pytest.fixture(scope="module")
def inflect_official(scratch) -> dict:
    """The Nano-shaped random Inflect v2 model with the official I/O (decode.onnx, duration.onnx, config.json)."""
    from rkaudio.families.inflect.reference import NANO, export_official

    return export_official(scratch / "inflect_nano", NANO, seed=0)


@pytest.fixture(scope="module")
def inflect_slice(scratch, inflect_official) -> Path:
    """`convert inflect --skip-rknn`: the decoder slice at the default window, its verdicts printed."""
    out = scratch / "inflect_export"
    result = run(scratch, "inflect", "--decode-onnx", str(inflect_official["decode"]), "--duration-onnx",
                 str(inflect_official["duration"]), "--skip-rknn", "--out", str(out))
    assert "[PASS] tail_snr" in result.stdout, output(result)
    (onnx_path,) = [p for p in out.glob("*.onnx") if not p.name.endswith(".fp32.onnx")]
    return onnx_path


@runs("inflect")
def test_inflect(inflect_slice):
    assert inflect_slice.with_suffix(".selfcheck.npz").is_file()


@runs("check inflect")
def test_check_inflect(scratch, inflect_official, inflect_slice):
    tokens = ",".join(map(str, [0, 12, 0, 40, 0, 77, 0, 3, 0, 150, 0, 9, 0] * 5))
    result = run(scratch, "check", "inflect", "--duration-onnx", str(inflect_official["duration"]), "--tokens", tokens,
                 "--engine", str(inflect_slice), "--decode-onnx", str(inflect_official["decode"]))
    assert FP16_ESTIMATE in result.stdout and 20.0 < overall_snr(result.stdout) < math.inf
    missing = convert("check", "inflect", "--duration-onnx", str(inflect_official["duration"]), cwd=scratch)
    assert missing.returncode == 2 and "give --tokens" in missing.stderr and "runtime/text" in missing.stderr


@pytest.fixture(scope="module")
def audio8_plan(scratch) -> Path:
    out = scratch / "audio8_plan"
    run(scratch, "audio8", "--random-weights", "small", "--skip-rknn", "--out", str(out))
    return out


@runs("audio8")
def test_audio8(audio8_plan):
    assert (audio8_plan / "audio8_plan.json").is_file() and list(audio8_plan.glob("*.onnx"))


@runs("check audio8")
def test_check_audio8(scratch, audio8_plan):
    """The default backend on a --skip-rknn export: the fp32 graphs' tokens and the fp16-rounded graphs' tokens."""
    from rkaudio.families.audio8.checks import probe_clip
    from rkaudio.board.speech import write_wav

    wav = write_wav(scratch / "clip_3s.wav", probe_clip(3.0), 16000)
    result = run(scratch, "check", "audio8", "--plan", str(audio8_plan), "--wav", str(wav))
    token_lines = [line for line in result.stdout.splitlines() if line.startswith("tokens")]
    assert len(token_lines) == 2 and any(FP16_ESTIMATE in line for line in token_lines), result.stdout


@runs("cosyvoice3")
def test_cosyvoice3(scratch):
    out = scratch / "cosyvoice3_export"
    run(scratch, "cosyvoice3", "--random-weights", "small", "--skip-rknn", "--out", str(out))
    assert list(out.glob("cosyvoice3_flow_s*.onnx"))


@runs("check cosyvoice3")
def test_check_cosyvoice3(scratch):
    result = run(scratch, "check", "cosyvoice3", "--random-weights", "small")
    assert FP16_ESTIMATE in result.stdout
    snrs = [float(value) for value in re.findall(r"(-?[\d.]+|inf) dB", result.stdout)]
    assert snrs and all(math.isfinite(value) for value in snrs), result.stdout
    assert np.load(scratch / "work" / "cosyvoice3" / "check.npy").ndim == 2


@pytest.fixture(scope="module")
def qwen3_snapshot(scratch) -> Path:
    """The tiny random-init Qwen3-TTS speech-tokenizer decoder as a snapshot folder."""
    from rkaudio.families.qwen3_vocoder import snapshot
    from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG, random_reference

    reference = random_reference(TINY_CONFIG, seed=0, gain=1.0)
    return snapshot.write(scratch / "qwen3_tiny", TINY_CONFIG, reference.state_dict())


@runs("qwen3-vocoder")
def test_qwen3_vocoder(scratch, qwen3_snapshot):
    out = scratch / "qwen3_export"
    run(scratch, "qwen3-vocoder", "--model-dir", str(qwen3_snapshot), "--skip-rknn", "--out", str(out))
    assert list(out.glob("*.onnx"))


@runs("check qwen3-vocoder")
def test_check_qwen3_vocoder(scratch, qwen3_snapshot):
    result = run(scratch, "check", "qwen3-vocoder", "--model-dir", str(qwen3_snapshot))
    assert FP16_ESTIMATE in result.stdout and 20.0 < overall_snr(result.stdout) < math.inf


@pytest.fixture(scope="module")
def dynamic_vocoder(scratch) -> Path:
    """The reduced MMS-TTS VITS decoder as a user exports it: its latent's time axis dynamic."""
    from tests.speech_models import export

    return export("mms_tts_decoder", scratch / "mms_decoder.onnx", "reduced", dynamic_time=True)


@runs("vocoder")
def test_vocoder(scratch, dynamic_vocoder):
    result = run(scratch, "vocoder", "--model", str(dynamic_vocoder))
    assert "[PASS] interior_snr_min" in result.stdout and "[PASS] tail_snr" in result.stdout, output(result)
    manifest = json.loads((scratch / "work" / "vocoder" / "mms_decoder_w64.manifest.json").read_text())
    assert manifest["contract"]["window"] == 64 and manifest["regtask"]["lines"] == 0


@runs("check vocoder")
def test_check_vocoder(scratch, dynamic_vocoder):
    result = run(scratch, "check", "vocoder", "--model", str(dynamic_vocoder))
    assert FP16_ESTIMATE in result.stdout and 20.0 < overall_snr(result.stdout) < math.inf
    windowing = re.search(r"fp32 render vs full-length reference \(the windowing alone\): (\S+) dB", result.stdout)
    assert windowing and float(windowing.group(1)) >= 90.0, result.stdout[-3000:]
    assert {p.name for p in scratch.glob("vocoder*")} >= {"vocoder.wav", "vocoder.fp32.wav", "vocoder.full.wav",
                                                           "vocoder.png"}
