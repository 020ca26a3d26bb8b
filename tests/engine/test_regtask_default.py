"""`convert build` allows no REGTASK line unless the user raises `--max-regtask-lines` on purpose, and then its
summary shows the worst overflow. The graph: Conv1d(22->22, k=3) + Sin + Add on [1, 22, 16385], whose 16,385-sample
axis exceeds rk3566's 13-bit register field (limit 0x1fff): rknn-toolkit2 2.3.2 logs 6 REGTASK lines for it there,
the worst 2.00x its field (value 0x3fe0), and builds in about 6 s."""
from __future__ import annotations

import json
import re

from rkaudio.cli.families import declaration, family_names
from tests.convert_app import convert, output
from tests.engine.test_build import assert_no_engine_left

OVERFLOW_GRAPH = {"channels": 22, "length": 16385, "activation": "Sin"}


def worst_line_in(log: str) -> str:
    """The worst REGTASK line of a build log in the summary's words, read off the log with a regex of its own."""
    found = re.findall(r"target: (\w+), offset: (0x[0-9a-f]+), shift = \d+, limit: (0x[0-9a-f]+), value: (0x[0-9a-f]+)",
                       log)
    target, offset, limit, value = max(found, key=lambda line: int(line[3], 16) / int(line[2], 16))
    ratio = int(value, 16) / int(limit, 16)
    return f"worst {ratio:.2f}x its field (value {value}, limit {limit}, target {target} offset {offset})"


def test_a_default_build_fails_on_a_regtask_line_and_says_what_to_do(graph, tmp_path, require_converter):
    require_converter()
    onnx_path = graph("conv_sin", **OVERFLOW_GRAPH)
    failed = convert("build", str(onnx_path), "--target", "rk3566", "--out", str(tmp_path / "out"))
    assert failed.returncode == 3, output(failed)
    assert "[FAIL] regtask_lines" in failed.stderr and "(threshold 0)" in failed.stderr, output(failed)
    log = (tmp_path / "out" / "conv_sin.build.log").read_text()
    assert worst_line_in(log) in failed.stderr, output(failed)
    advice = [line for line in failed.stderr.splitlines() if "what to do:" in line]
    assert len(advice) == 1 and "narrower window" in advice[0] and "polyphase" in advice[0], output(failed)
    assert "raise --max-regtask-lines" in advice[0] and "on purpose" in advice[0], output(failed)
    assert_no_engine_left(tmp_path / "out", "conv_sin")


def test_a_raised_allowance_builds_and_the_summary_shows_the_worst_overflow(graph, tmp_path, require_converter):
    require_converter()
    onnx_path = graph("conv_sin", **OVERFLOW_GRAPH)
    built = convert("build", str(onnx_path), "--target", "rk3566", "--out", str(tmp_path / "out"),
                    "--max-regtask-lines", "1000")
    assert built.returncode == 0, output(built)
    manifest = json.loads((tmp_path / "out" / "conv_sin.manifest.json").read_text())
    lines = manifest["regtask"]["lines"]
    assert lines > 0
    worst = worst_line_in((tmp_path / "out" / "conv_sin.build.log").read_text())
    assert f"  regtask: {lines} lines, {worst}" in built.stdout.splitlines(), output(built)
    assert f"[PASS] regtask_lines: {lines} lines (threshold 1000)  {worst}; fields" in built.stdout, output(built)


def test_every_build_command_defaults_to_no_regtask_line():
    """`convert build` and every family command: the one default, `BuildOptions`'s."""
    import typer

    from rkaudio import cli

    if not cli.app.registered_commands:  # discovery runs once per process (main() does it at start)
        cli._register_all()
    commands = typer.main.get_command(cli.app).commands
    for name in ["build", *(declaration(family).command_name for family in family_names())]:
        options = {opt: param for param in commands[name].params for opt in param.opts}
        assert options["--max-regtask-lines"].default == 0, name
