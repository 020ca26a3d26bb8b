"""The bench harness (bench/run.py) runs a named benchmark's main(argv) with the options given, prints its rows as a
table and writes the JSON; and every bench keeps its one convention: main(argv) parsing its own options (`--help`
lists them), no setting read from the environment, `run.script(__file__)` as its `__main__`."""
import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from rkaudio.core.paths import REPO_ROOT

BENCH_DIR = REPO_ROOT / "bench"
_spec = importlib.util.spec_from_file_location("bench_run", BENCH_DIR / "run.py")
bench_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_run)

SCRIPT = 'if __name__ == "__main__":\n    import run\n\n    run.script(__file__)\n'
# A bench that keeps the convention; the planted ones below each break it one way.
KEEPS = '''"""A tiny bench."""
import os


def main(argv=None):
    import run

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--frames", type=int, default=64)
    frames = parser.parse_args(argv).frames
    return [{"frames": frames}]


''' + SCRIPT


@pytest.fixture
def bench_dir(tmp_path, monkeypatch):
    """A bench folder of its own beside the real one's run.py (`import run` finds it), sys.path restored after."""
    monkeypatch.setattr(sys, "path", [str(BENCH_DIR), *sys.path])
    (tmp_path / "run.py").symlink_to(BENCH_DIR / "run.py")
    return tmp_path


def convention_breaks(bench_dir, name: str) -> list[str]:
    """How bench_dir/<name>.py breaks the convention bench/run.py states (none: [])."""
    source = (bench_dir / f"{name}.py").read_text()
    tree = ast.parse(source)
    breaks = []
    guards = [node for node in tree.body
              if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"]
    if [ast.dump(node) for node in guards] != [ast.dump(ast.parse(SCRIPT).body[0])]:
        breaks.append("its __main__ is not `import run; run.script(__file__)`")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node) in ("os.environ", "os.getenv"):
            breaks.append(f"line {node.lineno} reads a setting from the environment ({ast.unparse(node)})")
    try:
        bench_run.run(name, ["--help"], bench_dir=bench_dir, results_dir=bench_dir / "results")
        breaks.append("--help ran the bench")
    except SystemExit as stop:
        if stop.code != 0:
            breaks.append(f"--help: {stop.code}")
    return breaks


@pytest.mark.parametrize("name", bench_run.available())
def test_every_bench_keeps_the_convention(name, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert convention_breaks(BENCH_DIR, name) == []
    assert capsys.readouterr().out.startswith(f"usage: bench/run.py {name} ")


@pytest.mark.parametrize("planted, broken", [
    (KEEPS.replace("def main(argv=None):", "def main():").replace("parse_args(argv)", "parse_args([])"),
     "main(argv: list[str] | None = None) -> list[dict]"),
    (KEEPS.replace("parser.parse_args(argv).frames", 'int(os.environ.get("TINY_FRAMES", 64))'),
     "reads a setting from the environment (os.environ)"),
    (KEEPS.replace("parser.parse_args(argv).frames", "64"), "--help ran the bench"),
    (KEEPS.replace(SCRIPT, 'if __name__ == "__main__":\n    print(main())\n'), "its __main__ is not"),
])
def test_a_bench_that_breaks_the_convention_is_named(bench_dir, planted, broken, capsys):
    (bench_dir / "tiny.py").write_text(KEEPS)
    assert convention_breaks(bench_dir, "tiny") == []
    (bench_dir / "tiny.py").write_text(planted)
    breaks = convention_breaks(bench_dir, "tiny")
    assert any(broken in line for line in breaks), breaks


def test_harness_prints_the_rows_and_writes_them_to_results(tmp_path, capsys):
    (tmp_path / "tiny.py").write_text(
        "def main(argv=None):\n"
        "    return [{'frames': 64, 'build_s': 1.5, 'snr_db': float('inf')}, {'frames': 128, 'build_s': 2.25}]\n")
    out = bench_run.run("tiny", bench_dir=tmp_path, results_dir=tmp_path / "results")
    assert out == tmp_path / "results" / "tiny.json"
    data = json.loads(out.read_text())
    assert data["name"] == "tiny" and data["rows"] == [
        {"frames": 64, "build_s": 1.5, "snr_db": "inf"}, {"frames": 128, "build_s": 2.25}]
    assert {"measured_at", "host", "producer"} <= set(data)
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["frames", "build_s", "snr_db"] and table[3].split() == ["128", "2.25", "-"]


def test_the_options_reach_main_from_the_harness_and_from_the_script(bench_dir, capsys):
    """`bench/run.py tiny --frames 32` and `python tiny.py --frames 32` are one run; results/ beside the bench."""
    (bench_dir / "tiny.py").write_text(KEEPS)
    out = bench_run.run("tiny", ["--frames", "32"], bench_dir=bench_dir)
    assert out == bench_dir / "results" / "tiny.json"
    assert json.loads(out.read_text())["rows"] == [{"frames": 32}]
    out.unlink()
    script = subprocess.run([sys.executable, str(bench_dir / "tiny.py"), "--frames", "16"], capture_output=True,
                            text=True, cwd=bench_dir)
    assert script.returncode == 0, script.stderr
    assert json.loads(out.read_text())["rows"] == [{"frames": 16}]


def test_a_function_runs_in_a_fresh_process_and_returns_its_result(bench_dir):
    (bench_dir / "tiny.py").write_text(KEEPS + textwrap.dedent("""

        def measure(width, out):
            if width < 0:
                raise ValueError(f"no width {width}")
            return {"width": width, "out": out, "pid": os.getpid()}
        """))
    module = bench_run.load("tiny", bench_dir)
    process, result = bench_run.in_child(module.measure, [64, "/tmp/x"], capture_output=True, text=True)
    assert process.returncode == 0, process.stderr
    assert result["width"] == 64 and result["out"] == "/tmp/x" and result["pid"] != os.getpid()
    process, result = bench_run.in_child(module.measure, [-1, "/tmp/x"], capture_output=True, text=True)
    assert process.returncode != 0 and result is None and "ValueError: no width -1" in process.stderr


def test_unknown_benchmark_names_the_available_ones(tmp_path):
    (tmp_path / "tiny.py").write_text("def main(argv=None):\n    return []\n")
    with pytest.raises(SystemExit, match="available: tiny"):
        bench_run.run("nope", bench_dir=tmp_path, results_dir=tmp_path)


def test_a_benchmark_that_returns_no_rows_is_refused(tmp_path):
    (tmp_path / "silent.py").write_text("def main(argv=None):\n    print('my own table')\n")
    with pytest.raises(SystemExit, match="must return a list of row dicts"):
        bench_run.run("silent", bench_dir=tmp_path, results_dir=tmp_path)
    assert not (tmp_path / "silent.json").exists()
