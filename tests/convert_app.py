"""The `convert` app as a user runs it: the console script that `pip install` put beside this interpreter, in a
child process, with the user's defaults. Tests that mean "what the user types" go through here, never through a
command function registered on a private app."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from rkaudio.core.paths import REPO_ROOT

# The console scripts pyproject.toml declares; both run the same app.
SCRIPTS = ("convert", "rkaudio")


def script(name: str = "convert") -> Path:
    """The installed console script `name` of this venv (the editable install `make venvs` makes)."""
    path = Path(sys.executable).with_name(name)
    assert path.is_file(), f"no console script {path}: the export venv installs rkaudio with `pip install -e .`"
    return path


def convert(*args: str, cwd: Optional[Path] = None, timeout: float = 1200, script_name: str = "convert",
            env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """`convert ARGS...` in `cwd` (default: the repository root, where `work/` and `recipes/` are): the finished
    process, its stdout and stderr as text."""
    return subprocess.run([str(script(script_name)), *args], cwd=cwd or REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def output(result: subprocess.CompletedProcess) -> str:
    """What a failed run printed, for an assertion message (the ends of stdout and stderr)."""
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
