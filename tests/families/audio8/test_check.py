"""`convert check audio8` as a user types it: a WAV decoded twice by the board's runtime, through the fp32 graphs
and through the engines (`--backend onnx`: every tensor rounded to fp16; `--backend simulator`: each graph compiled
for the target), from a plan directory (`--plan`) or a package (`--package`); both token lists and where they part.
A clip the graphs cannot take is refused in one line."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from rkaudio.families.audio8.checks import probe_clip
from rkaudio.release.check import FP16_ESTIMATE
from rkaudio.board.speech import write_wav
from tests.convert_app import convert, output

TOKENS = re.compile(r"^tokens \((.+)\): ([\d,]+)$", re.MULTILINE)


def decoded(result) -> dict[str, list[int]]:
    """The token lists a successful check printed, by what decoded them (`fp32`, the engines' label)."""
    assert result.returncode == 0, output(result)
    print(result.stdout)
    return {label: [int(token) for token in tokens.split(",")] for label, tokens in TOKENS.findall(result.stdout)}


def clip(tmp_path, seconds: float, rate: int = 16000):
    """A chirp in noise of `seconds` (the export gates' probe clip) as a 16-bit WAV."""
    return write_wav(tmp_path / f"clip_{seconds:g}s_{rate}.wav", probe_clip(seconds), rate)


def refusal(result) -> str:
    """The one stderr line of a user-facing setup error (exit 2, no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, output(result)
    return lines[0]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """`convert audio8 --random-weights small --skip-rknn`: the graphs and their plan, no engine (no .rknn)."""
    out = tmp_path_factory.mktemp("audio8_plan")
    result = convert("audio8", "--random-weights", "small", "--skip-rknn", "--out", str(out))
    assert result.returncode == 0, output(result)
    return out


@pytest.fixture(scope="module")
def built_plan(tmp_path_factory):
    """`convert audio8 ... --target rk3576`, engines built (rk3576: on rk3588 the small model's head-split Reshapes
    land on the CPU). One bucket and one head shard: five graphs, the fewest the runtime runs (about 35 s)."""
    from rkaudio.toolkit.versions import converter_python

    converter_python("2.3.2")  # fails (never skips) without the converter venv `make test` creates
    out = tmp_path_factory.mktemp("audio8_built")
    result = convert("audio8", "--random-weights", "small", "--target", "rk3576", "--kv-buckets", "128",
                     "--head-shards", "1", "--no-stress", "--out", str(out))
    assert result.returncode == 0, output(result)
    return out


@pytest.mark.parametrize("seconds", [0.7, 3.1])  # any length, not only the 2/4/6/8 s the spec cut its clips to
def test_the_default_backend_decodes_through_fp32_and_the_fp16_estimate(plan, tmp_path, seconds):
    """The bug of issue #39: the check went to rknnlite and asked for encoder.rknn, which --skip-rknn never writes."""
    result = convert("check", "audio8", "--plan", str(plan), "--wav", str(clip(tmp_path, seconds)))
    tokens = decoded(result)
    assert list(tokens) == ["fp32", FP16_ESTIMATE], result.stdout
    assert f"decoded through the fp32 graphs and through {FP16_ESTIMATE}" in result.stdout
    fp32, estimate = tokens["fp32"], tokens[FP16_ESTIMATE]
    assert fp32 and estimate
    # the small random model's clips decode to EOS well inside the first bucket, and fp16 keeps every token
    assert fp32 == estimate and f"agree: all {len(fp32)} tokens" in result.stdout, result.stdout
    assert "buckets: 128\n" in result.stdout


@pytest.mark.parametrize("seconds, rate, message", [
    (9.0, 16000, "audio of 9.00 s is longer than the 8 s the encoder takes (800 mel frames): split it into clips "
                 "of at most 8 s"),
    (1.0, 8000, "is 8000 Hz; resample it to 16000 Hz"),
])
def test_a_clip_the_graphs_cannot_take_is_refused_in_one_line(plan, tmp_path, seconds, rate, message):
    result = convert("check", "audio8", "--plan", str(plan), "--wav", str(clip(tmp_path, seconds, rate)))
    assert message in refusal(result)


def test_the_graphs_come_from_the_plan_or_the_package(plan, tmp_path):
    wav = str(clip(tmp_path, 0.7))
    assert "give --plan DIR (written by `convert audio8`) or --package DIR" in refusal(
        convert("check", "audio8", "--wav", wav))
    assert f"--plan {plan} and --package {plan} both name the graphs: give one" in refusal(
        convert("check", "audio8", "--plan", str(plan), "--package", str(plan), "--wav", wav))


def test_a_built_plan_decodes_in_the_simulator(built_plan, tmp_path):
    """Every graph the runtime opens is compiled for --target in the simulator (and closed: the check returns)."""
    result = convert("check", "audio8", "--plan", str(built_plan), "--wav", str(clip(tmp_path, 3.1)),
                     "--backend", "simulator", "--target", "rk3576", "--max-new-tokens", "5")
    label = "simulator, rk3576, toolkit 2.3.2"
    tokens = decoded(result)
    assert list(tokens) == ["fp32", label] and len(tokens[label]) == 5, result.stdout
    compiled = re.findall(r"^compiling (\S+) for rk3576 in the rknn-toolkit2 2\.3\.2 simulator", result.stdout,
                          re.MULTILINE)
    assert compiled == ["encoder.onnx", "adapter.onnx", "prefill.onnx", "step_s128.onnx", "head_0.onnx"]
    assert re.search(r"^agree: ", result.stdout, re.MULTILINE), result.stdout


def test_a_package_decodes_through_the_onnx_its_manifests_name(built_plan, tmp_path):
    """A package holds the engines, their manifests, the plan and the embedding table; its ONNX live where the
    manifests say (work/dist/... for `convert engines`). It decodes as the plan it was built from does."""
    package, onnx_home = tmp_path / "audio8_small_rk3576", tmp_path / "onnx"
    package.mkdir()
    onnx_home.mkdir()
    for path in built_plan.iterdir():
        if path.suffix == ".onnx":
            shutil.copy2(path, onnx_home / path.name)
        elif path.name.endswith(".manifest.json"):
            manifest = json.loads(path.read_text())
            manifest["onnx"]["path"] = os.path.relpath(onnx_home / manifest["onnx"]["path"], package)
            (package / path.name).write_text(json.dumps(manifest))
        elif path.suffix == ".rknn" or path.name in ("audio8_plan.json", "embed_tokens.npy"):
            shutil.copy2(path, package / path.name)
    wav = str(clip(tmp_path, 0.7))
    from_package = decoded(convert("check", "audio8", "--package", str(package), "--wav", wav))
    from_plan = decoded(convert("check", "audio8", "--plan", str(built_plan), "--wav", wav))
    assert from_package == from_plan and list(from_package) == ["fp32", FP16_ESTIMATE]
    (package / "head_0.manifest.json").unlink()
    assert (f"the audio8_plan.json of {package} names head_0.rknn, which no manifest there describes"
            in refusal(convert("check", "audio8", "--package", str(package), "--wav", wav)))


def test_where_the_lists_part_is_said(plan, tmp_path):
    """Planted fp32 twins of the LM head shards (`<stem>.fp32.onnx`, what the fp32 run reads) with their weights
    negated: the fp32 run picks the least likely token, so the lists part at the first token by a margin no fp16
    tie explains."""
    import onnx
    from onnx import numpy_helper

    planted = tmp_path / "plan"
    shutil.copytree(plan, planted)
    for head in planted.glob("head_*.onnx"):
        model = onnx.load(str(head))
        weight = max(model.graph.initializer, key=lambda tensor: len(numpy_helper.to_array(tensor).reshape(-1)))
        weight.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(weight), weight.name))
        onnx.save(model, str(head.with_suffix(".fp32.onnx")))
    result = convert("check", "audio8", "--plan", str(planted), "--wav", str(clip(tmp_path, 0.7)))
    tokens = decoded(result)
    assert tokens["fp32"][0] != tokens[FP16_ESTIMATE][0], result.stdout
    assert re.search(rf"^agree: the first 0 of {len(tokens['fp32'])} fp32 tokens \({len(tokens[FP16_ESTIMATE])} "
                     rf"through {re.escape(FP16_ESTIMATE)}\); first divergence at token 0: fp32 top-2 margin .* "
                     r"\(NOT explained\)$", result.stdout, re.MULTILINE), result.stdout
