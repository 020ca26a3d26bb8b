"""Reproducible engines: two compiles of one ONNX are byte-identical (the compiler child's heap is filled with a
fixed byte), a changed weight changes the digest, and `convert verify --rebuild` checks a package that way."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
from onnx import numpy_helper

from rkaudio.engine.build import BuildOptions, compile_only
from rkaudio.core.contract import get_contract, set_contract
from rkaudio.core.manifest import normalized_sha256
from rkaudio.board.files import sha256_file


def _changed_weight(source, target) -> None:
    model = onnx.load(str(source))
    weight = model.graph.initializer[0]
    values = numpy_helper.to_array(weight).copy()
    values.flat[0] += 0.5
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(model, str(target))


def test_the_same_onnx_twice_gives_equal_digests_and_a_changed_weight_does_not(example_package, tmp_path,
                                                                              require_converter):
    require_converter("2.3.2")
    manifest = json.loads((example_package / "example_c16_t64.manifest.json").read_text())
    onnx_path = (example_package / manifest["onnx"]["path"]).resolve()
    options = BuildOptions("rk3588", "2.3.2")
    first = compile_only(onnx_path, options, tmp_path / "first.rknn")
    second = compile_only(onnx_path, options, tmp_path / "second.rknn")
    assert sha256_file(first) == sha256_file(second) == manifest["rknn"]["sha256"]
    assert normalized_sha256(first, manifest["producer_git"]) == manifest["rknn"]["normalized_sha256"]
    _changed_weight(onnx_path, tmp_path / "changed.onnx")
    changed = compile_only(tmp_path / "changed.onnx", options, tmp_path / "changed.rknn")
    assert sha256_file(changed) != sha256_file(first)


def test_two_commits_that_change_no_engine_give_equal_normalized_digests(example_package, tmp_path,
                                                                        require_converter):
    """The engine embeds its producer commit (custom_string): the same graph exported at another commit gives
    another sha256, and the same normalized_sha256 (the commit masked)."""
    require_converter("2.3.2")
    manifest = json.loads((example_package / "example_c16_t64.manifest.json").read_text())
    onnx_path = (example_package / manifest["onnx"]["path"]).resolve()
    model = onnx.load(str(onnx_path))
    contract = get_contract(model)
    here, other = contract["producer"]["git"], "f" * len(contract["producer"]["git"])
    onnx.save(set_contract(model, {**contract, "producer": {**contract["producer"], "git": other}}),
              str(tmp_path / "other_commit.onnx"))
    options = BuildOptions("rk3588", "2.3.2")
    engine = compile_only(onnx_path, options, tmp_path / "here.rknn")
    again = compile_only(tmp_path / "other_commit.onnx", options, tmp_path / "other.rknn")
    assert sha256_file(engine) != sha256_file(again)
    assert normalized_sha256(engine, here) == normalized_sha256(again, other) == manifest["rknn"]["normalized_sha256"]


def test_verify_rebuild_names_an_engine_its_onnx_no_longer_gives(package, tmp_path, require_converter):
    from rkaudio.release.kit import rebuild_problems

    require_converter("2.3.2")
    manifest = json.loads((package / "example_c16_t64.manifest.json").read_text())
    kept = (package / manifest["onnx"]["path"]).resolve().parent
    onnx_dir = tmp_path / "onnx"
    shutil.copytree(kept, onnx_dir)
    assert rebuild_problems(package, onnx_dir, say=lambda _: None) == []
    _changed_weight(kept / "example_c16_t64.onnx", onnx_dir / "example_c16_t64.onnx")
    problems = rebuild_problems(package, onnx_dir, say=lambda _: None)
    assert len(problems) == 1 and problems[0].startswith("example_c16_t64.rknn: a rebuild")
