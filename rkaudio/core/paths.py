"""Where things are: the repository, the venvs, and the names of every artifact beside an exported ONNX.
Each name is defined here once; the exporters, the build and the packaging step all use these. The names the
board reads too (the kit folder, SHA256SUMS, the manifest suffix) are in rkaudio/board/files.py."""
from __future__ import annotations

import os
from pathlib import Path

from rkaudio.board.files import MANIFEST_SUFFIX

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # rkaudio/: the installed package, every room a folder
REPO_ROOT = PACKAGE_ROOT.parent
WORK_ROOT = Path("work")  # default output root of `convert <family>`: work/<family>


def venv_root() -> Path:
    return Path(os.environ.get("RKAUDIO_VENV_DIR", REPO_ROOT / ".venv"))


def work_dir(family: str) -> Path:
    """The default output directory of `convert <family>` (relative to where it runs)."""
    return WORK_ROOT / family


def selfcheck_path(onnx_path: Path) -> Path:
    """Self-check inputs of an exported ONNX: an .npz keyed by its input names (one run)."""
    return Path(onnx_path).with_suffix(".selfcheck.npz")


def reference_path(onnx_path: Path) -> Path:
    """The exact fp32 twin of an engine graph that relies on fp16 arithmetic (the host runs it, the
    simulator gate compares with it)."""
    return Path(onnx_path).with_suffix(".fp32.onnx")


def engine_name(onnx_path: Path) -> str:
    return Path(onnx_path).stem + ".rknn"


def manifest_name(onnx_path: Path) -> str:
    return Path(onnx_path).stem + MANIFEST_SUFFIX


def build_log_name(onnx_path: Path) -> str:
    return Path(onnx_path).stem + ".build.log"


def end_to_end_spec(out_dir: Path, name: str) -> Path:
    """An end-to-end golden's declaration beside the ONNX files it runs (`<name>.e2e.json`: loop, engines,
    params); its inputs are `<name>.e2e.npz`."""
    return Path(out_dir) / f"{name}.e2e.json"


def end_to_end_inputs(spec_path: Path) -> Path:
    return Path(spec_path).with_name(Path(spec_path).name[: -len(".json")] + ".npz")


def snapshot_files(directory: Path) -> list[Path]:
    """Every file of a checkpoint snapshot directory (links resolved, hidden entries such as .cache skipped): what
    a family's `recipe_sources` names so that a changed checkpoint rebuilds its package."""
    directory = Path(directory)
    return sorted(p for p in directory.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(directory).parts))
