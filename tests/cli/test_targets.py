"""The target and the toolkit are typed values (`rkaudio.board.soc.Target`, `rkaudio.toolkit.versions.Toolkit`),
checked once where they come in (the CLI options, the recipe schema, BuildOptions, `Family.job`): `RK3588` on the
command line or in a recipe is rk3588 in every manifest, a family's export sees the normalised name (Piper's
per-target polyphase form for rk3576 included), and an unknown toolkit stops the command before any export."""
import json
import shutil
import sys

import onnx
import pytest

from rkaudio.board.soc import Target
from rkaudio.core.contract import get_contract
from rkaudio.core.errors import SetupError
from rkaudio.core.paths import REPO_ROOT
from rkaudio.toolkit.versions import Toolkit


def _convert(monkeypatch, capsys, *args) -> int:
    from rkaudio import cli

    monkeypatch.setattr(sys, "argv", ["convert", *map(str, args)])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    output = capsys.readouterr()
    assert exited.value.code == 0, output.err[-3000:]
    return exited.value.code


def test_a_typed_value_is_checked_once_and_passes_through():
    target = Target("RK3566")
    assert target == "rk3566" and Target(target) is target and isinstance(target, str)
    assert Toolkit(Toolkit("2.5.0")) == "2.5.0"
    with pytest.raises(SetupError, match="unknown target 'rk9999'; supported: rk3588"):
        Target("RK9999")
    with pytest.raises(SetupError, match="target rv1106 refused"):
        Target("rv1106")
    with pytest.raises(SetupError, match=r"unknown rknn-toolkit2 version '9\.9'; supported: 2\.3\.2, 2\.5\.0"):
        Toolkit("9.9")


def test_an_unknown_toolkit_stops_the_command_before_the_export(tmp_path, monkeypatch, capsys):
    from rkaudio import cli

    monkeypatch.setattr(sys, "argv", ["convert", "example", "--frames", "32", "--skip-rknn", "--toolkit", "9.9",
                                      "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    assert "unknown rknn-toolkit2 version '9.9'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def _targets(directory) -> set:
    return {json.loads(path.read_text())["target"] for path in directory.rglob("*.manifest.json")}


def test_build_and_engines_write_the_lower_case_target(tmp_path, monkeypatch, capsys, require_converter):
    require_converter("2.3.2")
    _convert(monkeypatch, capsys, "example", "--frames", "32", "--skip-rknn", "--out", tmp_path / "export")
    _convert(monkeypatch, capsys, "build", tmp_path / "export" / "example_c16_t32.onnx", "--target", "RK3588",
             "--out", tmp_path / "built")
    assert _targets(tmp_path / "built") == {"rk3588"}

    recipes_dir = tmp_path / "recipes"
    recipes_dir.mkdir()
    text = (REPO_ROOT / "recipes" / "example_conv.toml").read_text()
    (recipes_dir / "example_conv.toml").write_text(text.replace('"rk3588"', '"RK3588"').replace("[64, 128]", "[32]"))
    _convert(monkeypatch, capsys, "engines", "--target", "RK3588", "--recipes", recipes_dir, "--dist", tmp_path / "dist")
    package = tmp_path / "dist" / "rk3588" / "example_conv_rk3588"
    assert package.is_dir() and _targets(package) == {"rk3588"}


def _graph_without_metadata(path) -> bytes:
    model = onnx.load(str(path))
    del model.metadata_props[:]  # the contract holds the producer's command line, which spells the target
    return model.SerializeToString()


@pytest.mark.slow
def test_piper_target_in_capitals_builds_the_rk3576_polyphase_engine(tmp_path, monkeypatch, capsys, require_converter):
    require_converter("2.3.2")
    for spelled in ("RK3576", "rk3576"):
        _convert(monkeypatch, capsys, "piper", "--target", spelled, "--skip-rknn", "--out", tmp_path / spelled)
    [upper] = sorted((tmp_path / "RK3576").glob("*_decoder_*.onnx"))
    [lower] = sorted((tmp_path / "rk3576").glob("*_decoder_*.onnx"))
    assert upper.name == lower.name and "_poly" in upper.name, upper.name
    assert get_contract(upper)["polyphase"] is not None
    assert _graph_without_metadata(upper) == _graph_without_metadata(lower)
    _convert(monkeypatch, capsys, "piper", "--onnx", upper, "--target", "RK3576", "--out", tmp_path / "RK3576")
    assert _targets(tmp_path / "RK3576") == {"rk3576"}
    shutil.rmtree(tmp_path / "rk3576")


def test_a_relative_out_builds_the_engine_there(tmp_path, monkeypatch, capsys, require_converter):
    """The default `--out work/<family>` is relative; the compiler child runs in a directory of its own, so the
    engine path it is given must not be (before: exit 4, no '.<stem>.rknn.partial')."""
    require_converter("2.3.2")
    monkeypatch.chdir(tmp_path)
    _convert(monkeypatch, capsys, "example", "--frames", "32", "--target", "rk3588")
    assert (tmp_path / "work" / "example" / "example_c16_t32.rknn").is_file()
    assert _targets(tmp_path / "work" / "example") == {"rk3588"}
