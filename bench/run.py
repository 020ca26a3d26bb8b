"""`make bench NAME=x` (or `python bench/run.py x`): run `bench/x.py`'s `main()`, which returns a list of
row dicts, print them as a table and write `bench/results/x.json` with the rows and where they were measured.

Speed and memory figures live here, never in tests: a timed assertion fails on a busy machine."""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

from rkaudio.core.contract import producer_info
from rkaudio.release.package import format_table
from rkaudio.board.numeric import json_safe

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"


def available(bench_dir: Path = BENCH_DIR) -> list[str]:
    return sorted(p.stem for p in bench_dir.glob("*.py") if p.stem != "run" and not p.stem.startswith("_"))


def run(name: str, bench_dir: Path = BENCH_DIR, results_dir: Path = RESULTS_DIR) -> Path:
    """Run one benchmark; returns the path of its JSON result."""
    path = bench_dir / f"{name}.py"
    if not path.is_file():
        raise SystemExit(f"no benchmark {name!r}: expected {path}; "
                         f"available: {', '.join(available(bench_dir)) or 'none'}")
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a bench's dataclasses look their module up there
    spec.loader.exec_module(module)
    started = time.time()
    rows = module.main()
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise SystemExit(f"{path}: main() must return a list of row dicts for the harness, "
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: make bench NAME=<name>   (available: {', '.join(available()) or 'none'})")
    run(sys.argv[1])
