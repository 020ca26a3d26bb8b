"""`convert diagnose` (issue 15): rknn-toolkit2's accuracy_analysis in the converter child, reduced to a ranked
per-layer table and a PNG; its output row agrees with the build's simulator SNR; the dumps do not outlive it;
graphs relying on fp16 maths carry the caveat. The Piper decoder default engine is the acceptance case."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.core.contract import get_contract, set_contract
from rkaudio.gates.layer_error import format_rows, layer_table, output_row, parse_error_analysis, ranked
from rkaudio.toolkit.session import ConverterChild
from tests.conv_graphs import conv_graph

REPO = Path(__file__).resolve().parents[2]
CONVERT = [sys.executable, "-m", "rkaudio.cli"]

ERROR_ANALYSIS = """\
layer_name                  simulator_error
                        entire              single
                     cos      euc        cos      euc
-----------------------------------------------------------
[Input] x          1.00000 | 0.0       1.00000 | 0.0
[Reshape] x_rs     1.00000 | 0.0262    1.00000 | 0.0262
[Conv] y-rs        0.99988 | 6.0377    0.99988 | 6.0377
[Reshape] y        0.99988 | 6.0377    1.00000 | 2.2052
"""


def run_diagnose(*args) -> subprocess.CompletedProcess:
    result = subprocess.run([*CONVERT, "diagnose", *map(str, args)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def output_line_snr(stdout: str, output: str) -> float:
    match = re.search(rf"output {re.escape(output)}: (-?[\d.]+|inf) dB at the last layer", stdout)
    assert match, stdout
    return float(match.group(1))


def test_error_analysis_rows_parse():
    rows = parse_error_analysis(ERROR_ANALYSIS)
    assert list(rows) == ["x", "x_rs", "y-rs", "y"]
    assert rows["y-rs"] == {"op": "Conv", "entire_cos": 0.99988, "entire_euc": 6.0377, "single_cos": 0.99988,
                            "single_euc": 6.0377}


def test_tiny_graph_table_png_and_output_row_match_the_build(tmp_path, require_converter):
    require_converter()
    work = tmp_path / "work"
    work.mkdir()
    onnx_path = conv_graph(work / "tiny.onnx", blocks=3, activation="Sin")
    selfcheck = work / "tiny.selfcheck.npz"
    np.savez(selfcheck, x=np.random.default_rng(0).standard_normal((1, 8, 64)).astype(np.float32))
    result = build_engine(onnx_path, work, BuildOptions("rk3588"), selfcheck=selfcheck)
    out = tmp_path / "diag"
    stdout = run_diagnose(work, "--target", "rk3588", "--out", out).stdout
    print(stdout)
    assert "adding the most noise" in stdout and "ONNX node" in stdout and "conv2" in stdout
    at_build = result.manifest_data["simulator"]["y"]["snr_db"]
    assert abs(output_line_snr(stdout, "y") - at_build) < 0.5
    assert f"manifest simulator SNR {at_build:.2f} dB" in stdout and "caveat" not in stdout
    png = out / "tiny.layer_error.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = json.loads((out / "tiny.layer_error.json").read_text())
    assert table["outputs"]["y"]["onnx_node"] == "add2" and len(table["layers"]) >= 10
    assert {row["onnx_node"] for row in table["layers"]} >= {"conv0", "sin1", "add2"}


def test_analysis_dumps_are_removed(tmp_path, require_converter):
    require_converter()
    onnx_path = conv_graph(tmp_path / "tiny.onnx", blocks=2)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 8, 64)).astype(np.float32)}
    with ConverterChild(onnx_path, "rk3588", "2.3.2", None, rknn_path=None, simulate=True) as child:
        child.wait_ready()
        summary = child.analyse(feeds)
        left = sorted(p.name for p in child.work_dir.rglob("*") if p.suffix in (".npy", ".txt", ".npz"))
        work_dir = child.work_dir
    assert left == []  # neither the toolkit's dumps nor the request files survive the analysis
    assert not work_dir.exists()
    rows = layer_table(summary, onnx.load(str(onnx_path)))
    assert [row.name for row in rows][-1] == "y" and output_row(rows, "y").onnx_node == "add1"
    assert all(r.entire_snr_db > 40 for r in rows[1:]) and format_rows(ranked(rows, 3))[2].split()[0].isdigit()


def test_a_graph_relying_on_fp16_maths_carries_the_caveat(tmp_path, require_converter):
    require_converter()
    onnx_path = conv_graph(tmp_path / "sine.onnx", blocks=2, activation="Sin")
    twin = conv_graph(tmp_path / "sine.fp32.onnx", blocks=2, activation="Sin")
    model = onnx.load(str(onnx_path))
    contract = get_contract(model)
    contract["reference_onnx"] = twin.name
    onnx.save(set_contract(model, contract), str(onnx_path))
    stdout = run_diagnose(onnx_path, "--target", "rk3588", "--out", tmp_path / "diag").stdout
    assert "caveat: this graph relies on fp16 arithmetic (its fp32 twin sine.fp32.onnx" in stdout


@pytest.mark.slow
def test_piper_decoder_default_engine(tmp_path, require_converter):
    """Acceptance: the default joe decoder engine (w109/c32, rk3588): the table and the PNG, and the graph
    output's row within 0.5 dB of the manifest's simulator SNR."""
    require_converter()
    from rkaudio.families.piper import FAMILY, decoder

    [record] = decoder.export(FAMILY.job("decoder", target="rk3588", out=tmp_path))[:1]
    result = build_engine(record.onnx, tmp_path, BuildOptions("rk3588"), selfcheck=record.selfcheck,
                          export_verdicts=record.verdicts, reference_onnx=record.reference)
    stdout = run_diagnose(tmp_path, "--target", "rk3588", "--out", tmp_path / "diag").stdout
    print(stdout)
    figures = result.manifest_data["simulator"]["output"]
    assert abs(output_line_snr(stdout, "output") - figures["snr_db"]) < 0.5
    assert "/dec/" in stdout and "caveat" not in stdout
    assert (tmp_path / "diag" / f"{record.onnx.stem}.layer_error.png").stat().st_size > 10_000


def test_stage_names_from_module_paths_or_the_contract():
    from rkaudio.gates.layer_error import module_stage

    assert module_stage("/dec/resblocks.3/convs1.0/Conv") == "dec/resblocks.3/convs1.0"
    assert module_stage("/dec/conv_post/Conv") == "dec/conv_post"
    assert module_stage("Mul_5604") is None
    stages = {"/decoder/decoder.3/": "decoder block 3", "/decoder/": "decoder"}
    assert module_stage("/decoder/decoder.3/block.1/conv/Conv", stages) == "decoder block 3"
    assert module_stage("/decoder/decoder.0/conv/Conv", stages) == "decoder"
