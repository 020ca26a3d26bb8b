"""Gates that cannot be fooled (issue #14), Inflect v2: the tail gate against a planted decoder mask shifted by one
frame, every comparison judged on its whole reference (a silent decode.onnx fails the export in words), and
damaged official files refused in one line naming the file, exit 2.

Planted fault (the export's own self-check, fp32, dB vs a full-length decode.onnx decode; tail threshold
MIN_TAIL_DB = 90, the official checkpoints measure 94.9-120.2 dB there per the spec, so it stays):

| model | real export: tails 30/47/91/210, interior | decoder mask one frame late | one frame early |
|-------|-------------------------------------------|-----------------------------|-----------------|
| Nano  | 131.0-131.1, 131.1                        | 14.3 / 16.2 / 19.1 / 22.7   | 14.5 / 16.5 / 19.4 / 23.0 |
| Micro | 135.2-135.3, 135.3                        | 14.7 / 16.7 / 19.6 / 23.2   | 14.8 / 16.7 / 19.6 / 23.2 |

(interior windows run with mask 1 everywhere: the shift only reaches their context, they stay at the real figure.)"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from rkaudio.families.inflect import MIN_TAIL_DB
from rkaudio.families.inflect.decoder import TAIL_LENGTHS, load_decode, selfcheck_verdicts
from rkaudio.board.verdict import judged
from rkaudio.core.errors import GateFailure, SetupError
from rkaudio.core.paths import REPO_ROOT
from rkaudio.board.verdict import at_least

SILENT = "the reference output is silent: the checkpoint or the inputs make the model output zeros"
TAILS = [f"tail_snr[{n}]" for n in TAIL_LENGTHS]


def shifted_decoder_mask(shift: int):
    """Plant: `rkaudio.surgery.graph.mask.mask_decoder` fed the mask moved by `shift` frames (+1: one frame late, the
    first real frame masked and the first padded one unmasked; -1: one frame early, the last real frame masked).
    The flow keeps the true mask: only the decoder-half muls read the shifted one."""
    from rkaudio.surgery.graph import mask as M

    real = M.mask_decoder

    def mask_decoder(model, decoder_input, mask):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        name = f"{mask}_shifted{shift:+d}"
        constants = {f"{name}_pads": [0, 0, max(shift, 0), 0, 0, max(-shift, 0)], f"{name}_starts": [max(-shift, 0)],
                     f"{name}_ends": [-shift if shift > 0 else np.iinfo(np.int64).max], f"{name}_axes": [2]}
        out.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in constants.items())
        out.graph.node.insert(0, helper.make_node("Pad", [mask, f"{name}_pads"], [f"{name}_padded"]))
        out.graph.node.insert(1, helper.make_node("Slice", [f"{name}_padded", f"{name}_starts", f"{name}_ends",
                                                            f"{name}_axes"], [name]))
        return real(out, decoder_input, name)

    return mask_decoder


@pytest.mark.parametrize("shift", [1, -1], ids=["one frame late", "one frame early"])
def test_decoder_mask_shifted_by_one_frame_fails_the_tail_gate(nano_official, nano_record, tmp_path, monkeypatch,
                                                               shift):
    from rkaudio.families.inflect import FAMILY, export

    _, paths = nano_official
    monkeypatch.setattr("rkaudio.surgery.graph.mask.mask_decoder", shifted_decoder_mask(shift))
    [planted] = export(FAMILY.job(target="rk3588", out=tmp_path), paths["decode"], paths["duration"],
                       say=lambda *_: None)
    real, fault = ({v.name: v for v in record.verdicts} for record in (nano_record, planted))
    print(f"\nshift {shift:+d}: fault -> measured -> threshold -> verdict")
    for name in TAILS:
        print(f"  {name}: real {real[name].value:.1f} dB, planted {fault[name].value:.1f} dB -> "
              f"{fault[name].threshold:g} dB -> {'PASS' if fault[name].passed else 'FAIL'}")
    assert all(real[name].passed for name in real)
    assert [v.name for v in planted.verdicts if not v.passed] == TAILS
    assert all(fault[name].value < MIN_TAIL_DB - 40.0 for name in TAILS)


def _silenced(decode_path, out_path):
    """decode.onnx with its last conv (conv_post, the waveform's only producer before tanh) zeroed: silence."""
    model = onnx.load(str(decode_path))
    [post] = [n for n in model.graph.node if n.op_type == "Conv" and "conv_post" in (n.name + "".join(n.input))]
    for tensor in model.graph.initializer:
        if tensor.name in post.input[1:]:
            tensor.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(tensor)), tensor.name))
    onnx.save(model, str(out_path))
    return out_path


def test_every_comparison_refuses_a_silent_reference(nano_official, nano_slice, tmp_path):
    _, paths = nano_official
    silent = _silenced(paths["decode"], tmp_path / "decode.onnx")
    verdicts = selfcheck_verdicts(nano_slice, silent, paths["duration"], say=lambda *_: None)
    assert [v.name for v in verdicts] == TAILS + ["interior_snr_min"]
    assert all(not v.passed and np.isnan(v.value) and v.detail.startswith(SILENT) for v in verdicts)


def test_silent_decode_onnx_fails_its_export_and_keeps_no_slice(nano_official, tmp_path):
    from rkaudio.families.inflect import FAMILY, export

    _, paths = nano_official
    silent_dir = tmp_path / "model" / "onnx"
    silent_dir.mkdir(parents=True)
    silent = _silenced(paths["decode"], silent_dir / "decode.onnx")
    (tmp_path / "model" / "config.json").write_text(paths["config"].read_text())
    with pytest.raises(GateFailure) as failure:
        export(FAMILY.job(target="rk3588", out=tmp_path / "out"), silent, paths["duration"], say=lambda *_: None)
    text = str(failure.value)
    assert SILENT in text and "what to do: the comparison has nothing to judge" in text and "inf dB" not in text
    assert not list((tmp_path / "out").glob("*.onnx"))


def test_the_whole_reference_is_judged_never_one_window():
    """A quiet stretch (one silent window) in a real reference is not a silent checkpoint; all zeros is."""
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(8 * 256).astype(np.float32) * 0.1
    reference[:256] = 0.0
    verdict = at_least("interior_snr_min", 120.0, 90.0, "dB")
    assert judged(verdict, reference) is verdict
    silent = judged(verdict, np.zeros_like(reference))
    assert not silent.passed and silent.detail.startswith(SILENT)
    assert not judged(verdict, np.full_like(reference, 1e-9)).passed  # below 1e-6 of full scale


def test_degraded_self_check_judges_its_reference(nano_official, tmp_path):
    """Without decode.onnx the window-self check compares the slice with itself: a silent slice fails it too."""
    from rkaudio.core.contract import set_contract
    from rkaudio.families.inflect import FAMILY, decoder as D

    _, paths = nano_official
    model, info = D.describe(_silenced(paths["decode"], tmp_path / "decode.onnx"), paths["duration"])
    path = tmp_path / "silent_slice.onnx"
    sliced, window = D.slice_decoder(model, info, 256, 32)
    job = FAMILY.job(target="rk3588", out=tmp_path)
    onnx.save(set_contract(sliced, job.contract("main", **window.to_fields())), str(path))
    [verdict] = selfcheck_verdicts(path, None, paths["duration"], say=lambda *_: None)
    assert verdict.name == "window_self_snr" and not verdict.passed and verdict.detail.startswith(SILENT)


def convert_inflect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rkaudio.cli", "inflect", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("damaged, how", [
    ("decode.onnx", "truncated"), ("decode.onnx", "text"), ("duration.onnx", "truncated"), ("config.json", "text"),
])
def test_damaged_official_file_is_refused_in_one_line(nano_official, tmp_path, damaged, how, refused_in_one_line):
    _, paths = nano_official
    (tmp_path / "onnx").mkdir()
    files = {"decode.onnx": tmp_path / "onnx" / "decode.onnx", "duration.onnx": tmp_path / "onnx" / "duration.onnx",
             "config.json": tmp_path / "config.json"}
    for name, path in files.items():
        path.write_bytes(paths[name.split(".")[0]].read_bytes())
    data = files[damaged].read_bytes()
    files[damaged].write_bytes(data[: len(data) // 2] if how == "truncated" else b"<html>404 Not Found</html>")
    run = convert_inflect("--decode-onnx", str(files["decode.onnx"]), "--duration-onnx", str(files["duration.onnx"]),
                          "--skip-rknn", "--out", str(tmp_path / "out"))
    line = refused_in_one_line(run, files[damaged])
    assert ("is not valid JSON" if damaged == "config.json" else "is not a readable Inflect v2") in line
    assert not list((tmp_path / "out").glob("*.onnx"))


def test_nan_constant_in_decode_onnx_is_refused_naming_the_tensor(nano_official, tmp_path):
    _, paths = nano_official
    model = onnx.load(str(paths["decode"]))
    tensor = next(t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and t.dims)
    values = numpy_helper.to_array(tensor).copy()
    values.flat[0] = np.nan
    tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    onnx.save(model, str(tmp_path / "decode.onnx"))
    with pytest.raises(SetupError, match=rf"constant '{tensor.name}' holds 1 NaN/Inf"):
        load_decode(tmp_path / "decode.onnx")


@pytest.mark.parametrize("content, words", [
    (b'{"data": {"sampling_rate": 24000, "hop_', "is not valid JSON"),
    (b"[256, 24000]", "is not an Inflect v2 config.json"),
    (json.dumps({"data": {"hop_length": "big"}}).encode(), "are not integers"),
])
def test_config_json_that_is_not_a_config_is_refused(tmp_path, content, words):
    from rkaudio.board.inflect import config_values

    config = tmp_path / "config.json"
    config.write_bytes(content)
    with pytest.raises(SetupError) as error:
        config_values(config)
    assert words in str(error.value) and str(config) in str(error.value) and "\n" not in str(error.value)
