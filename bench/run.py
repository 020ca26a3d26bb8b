"""The bench harness: `make bench NAME=<name> ARGS="<options>"`, `python bench/run.py <name> <options>` and
`python bench/<name>.py <options>` all run `bench/<name>.py`'s `main(argv)` here, print the rows it returns as a
table and write `bench/results/<name>.json` with the rows and where they were measured.

Every bench follows one convention, which tests/bench/test_bench_harness.py checks:
- it defines `main(argv: list[str] | None = None) -> list[dict]`, which parses its options from `argv` with the
  parser `parser(__file__, __doc__)` gives (so `ARGS=--help` lists them under the bench's docstring) and returns
  its rows; its settings are options, never environment variables;
- it ends with `if __name__ == "__main__": import run; run.script(__file__)`, so run as a script it is this run;
- a measurement that needs a fresh process (its memory, and its children's peak RSS, its own) runs a function of
  the bench there with `in_child`.
The harness puts bench/ on sys.path, so a bench imports `run` and the helpers beside it (`_window_sweep`) by name;
`run` inside main(), since a test may load a bench by path to call its other functions.

Speed and memory figures live here, never in tests: a timed assertion fails on a busy machine."""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
if str(REPO) not in sys.path:  # the harness measures this checkout (a worktree's, not the venv's editable install)
    sys.path.insert(0, str(REPO))

from rkaudio.core.contract import producer_info  # noqa: E402
from rkaudio.release.package import format_table  # noqa: E402
from rkaudio.board.numeric import json_safe  # noqa: E402

CHILD = "--child"  # `bench/run.py --child BENCH FUNCTION RESULT ARGUMENTS`: the process `in_child` starts
CONVENTION = "main(argv: list[str] | None = None) -> list[dict]"


def available(bench_dir: Path = BENCH_DIR) -> list[str]:
    return sorted(p.stem for p in bench_dir.glob("*.py") if p.stem != "run" and not p.stem.startswith("_"))


def parser(bench_file: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser a bench's main() adds its options to: named as the harness runs the bench, its docstring as the
    help text."""
    return argparse.ArgumentParser(prog=f"bench/run.py {Path(bench_file).stem}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def load(name: str, bench_dir: Path = BENCH_DIR) -> ModuleType:
    """`bench_dir/<name>.py` as the module `bench_<name>`, with bench_dir importable; SystemExit when there is no
    such bench or its main() takes no argv."""
    path = bench_dir / f"{name}.py"
    if not path.is_file():
        raise SystemExit(f"no benchmark {name!r}: expected {path}; "
                         f"available: {', '.join(available(bench_dir)) or 'none'}")
    if str(bench_dir) not in sys.path:
        sys.path.insert(0, str(bench_dir))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a bench's dataclasses look their module up there
    spec.loader.exec_module(module)
    try:
        inspect.signature(module.main).bind([])
    except (AttributeError, TypeError):
        raise SystemExit(f"{path}: a bench defines {CONVENTION} (bench/run.py)") from None
    return module


def run(name: str, argv: Sequence[str] = (), bench_dir: Path = BENCH_DIR, results_dir: Path | None = None) -> Path:
    """Run one benchmark with its options `argv`; returns the path of its JSON result (in `results_dir`, by
    default the bench's folder's results/)."""
    results_dir = results_dir or bench_dir / "results"
    module = load(name, bench_dir)
    started = time.time()
    rows = module.main(list(argv))
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise SystemExit(f"{bench_dir / name}.py: main() must return a list of row dicts for the harness, "
                         f"got {type(rows).__name__}")
    print(format_table(rows))
    result = {
        "name": name,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 3),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "producer": producer_info(),
        "rows": rows,
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / f"{name}.json"
    out.write_text(json.dumps(json_safe(result), indent=2) + "\n")
    print(f"wrote {out}")
    return out


def script(bench_file: str) -> Path:
    """A bench's `__main__`: `python bench/<name>.py [options]` is `bench/run.py <name> [options]`."""
    path = Path(bench_file).resolve()
    return run(path.stem, sys.argv[1:], bench_dir=path.parent)


def in_child(function: Callable, arguments: list, **options) -> tuple[subprocess.CompletedProcess, object]:
    """`function(*arguments)`, a module-level function of a bench (JSON arguments and result), in a fresh Python
    process (this harness's `--child`): (the finished process, the function's result, None when the process
    failed). `options` go to subprocess.run (stderr=subprocess.PIPE, ...)."""
    with tempfile.TemporaryDirectory(prefix="bench-child-") as scratch:
        result = Path(scratch) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), CHILD, str(Path(inspect.getfile(function)).resolve()),
                   function.__name__, str(result), json.dumps(arguments)]
        process = subprocess.run(command, cwd=REPO, **options)
        return process, json.loads(result.read_text()) if process.returncode == 0 else None


def _child(bench_file: str, function: str, result: str, arguments: str) -> None:
    path = Path(bench_file)
    returned = getattr(load(path.stem, path.parent), function)(*json.loads(arguments))
    Path(result).write_text(json.dumps(returned))


def main(argv: list[str] | None = None) -> None:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == [CHILD]:
        _child(*arguments[1:])
    elif not arguments or arguments[0].startswith("-"):
        raise SystemExit(f'usage: make bench NAME=<name> [ARGS="<options>"], or bench/run.py <name> [options] '
                         f"(ARGS=--help: the bench's options; available: {', '.join(available()) or 'none'})")
    else:
        run(arguments[0], arguments[1:])


if __name__ == "__main__":
    main()
