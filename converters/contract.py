"""Build the contract an exported ONNX carries (see surgery/metadata.py), with producer info."""
from __future__ import annotations

import shlex
import subprocess
import sys
from importlib import metadata

from converters.toolkit import REPO_ROOT


def producer_info() -> dict:
    """rkaudio version, git commit (with a +dirty mark) and the command line that produced the file."""
    try:
        version = metadata.version("rkaudio")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    try:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        commit += "+dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    argv = ["convert", *sys.argv[1:]] if sys.argv and sys.argv[0].endswith(("convert", "cli.py")) else sys.argv
    return {"rkaudio": version, "git": commit, "command": shlex.join(argv)}


def make_contract(family: str, component: str, role: str, exec_plan_option: str, **fields) -> dict:
    """The metadata every exported component carries. `fields` are the family's own contract
    (window, context, hop, cache layout, ...); `exec_params` and `ladder_key` are optional keys the
    packaging step reads."""
    return {
        "family": family,
        "component": component,
        "role": role,
        "exec_plan_option": exec_plan_option,
        "producer": producer_info(),
        **fields,
    }
