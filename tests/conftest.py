"""Shared fixtures, those of tests/conv_graphs.py and tests/example_kit.py among them (tests of several folders use
them; registered here once, a session fixture is built once). Folders under tests/ add their own conftest.py."""
from __future__ import annotations

import os
import signal

import pytest

from rkaudio.core.errors import SetupError
from rkaudio.toolkit.versions import converter_python
from tests.conv_graphs import graph, inputs_npz  # noqa: F401  (fixtures)
from tests.example_kit import board_python, example_package, package, run_kit  # noqa: F401  (fixtures)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """`make test` runs two pytest-xdist workers (`--dist loadgroup`). Every `slow` test (pyproject.toml: a real-size
    or real-checkpoint build, a real voice's decode) goes to one group, so those run one after another on one worker
    and two real-size peaks never add up (the 16 GB bound); every other test is grouped with its file, so a module
    fixture is built once."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return
    for item in items:
        group = "slow" if item.get_closest_marker("slow") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="module", autouse=True)
def no_converter_child_outlives_its_module(request):
    """A simulator or build child left open holds its memory until the worker exits (the suite's 16 GB bound), and a
    test that looks for its own child would find it: once a module's fixtures are gone, none may be alive."""
    yield
    from tests.children import converter_children

    left = converter_children()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, (f"{request.node.nodeid} left {len(left)} converter child(ren) running (pids {left}): close "
                      "every SimulatorBackend / HostOpener / ConverterChild it opens (a `with` block)")


def converter_available(version: str) -> bool:
    try:
        converter_python(version)
        return True
    except SetupError:
        return False


@pytest.fixture
def require_converter():
    """Fails (never skips) when the converter venv is missing: `make test` creates both."""
    def check(version: str = "2.3.2") -> None:
        converter_python(version)  # raises SetupError with the make command to run
    return check


@pytest.fixture
def refused_in_one_line():
    """Checks a `python -m rkaudio.cli ...` run refused its input as a user-facing setup error: exit 2, one
    stderr line naming `path`, no traceback; returns that line."""
    def check(result, path) -> str:
        assert result.returncode == 2, result.stdout + result.stderr
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert str(path) in lines[0], lines[0]
        return lines[0]
    return check


@pytest.fixture
def family_cli():
    """Invokes the `convert <family>` command made from a declaration, alone (no other family is imported):
    `family_cli(FAMILY, "--frames", "64", ...)` -> typer's Result."""
    def invoke(family, *args: str):
        import typer
        from typer.testing import CliRunner

        from rkaudio.cli.families import family_command

        app = typer.Typer()
        app.command(family.command_name)(family_command(family))
        app.command("other")(lambda: None)  # two commands: typer keeps the family's as a sub-command
        return CliRunner().invoke(app, [family.command_name, *args])
    return invoke


@pytest.fixture
def check_report():
    """Reads back what `convert check <family>` wrote and printed (rkaudio.host.hearing.compare): asserts the
    engine WAV `out`, `<out>.fp32.wav`, `<out>.png` and (`full`) `<out>.full.wav` exist, the WAVs of one length,
    and returns the printed SNR of the engine render against the fp32 render, overall (dB; inf when exact)."""
    def read(output: str, out, full: bool = True) -> float:
        import re
        from pathlib import Path

        from rkaudio.host.audio import read_wav

        out = Path(out)
        wavs = [out, out.with_name(out.stem + ".fp32.wav")] + ([out.with_name(out.stem + ".full.wav")] if full else [])
        assert out.with_suffix(".png").is_file(), output
        lengths = {read_wav(wav)[0].size for wav in wavs}
        assert len(lengths) == 1 and lengths.pop() > 0, (wavs, output)
        match = re.search(r"engine render vs fp32 render: (\S+) dB overall", output)
        assert match, output
        return float(match.group(1))
    return read
