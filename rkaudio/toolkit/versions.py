"""Which toolkit builds, from which converter venv (the targets are `rkaudio.board.soc`). Stdlib only."""
from __future__ import annotations

from pathlib import Path

from rkaudio.core.errors import SetupError
from rkaudio.core.paths import venv_root

# 2.3.2 by default: a board's librknnrt refuses engines built by a newer toolkit
# ("Invalid RKNN model version"), and the spec's boards run api 2.3.2.
DEFAULT_TOOLKIT = "2.3.2"
SUPPORTED_TOOLKITS = ("2.3.2", "2.5.0")


def check_toolkit(version: str) -> str:
    if version not in SUPPORTED_TOOLKITS:
        raise SetupError(f"unknown rknn-toolkit2 version {version!r}; supported: {', '.join(SUPPORTED_TOOLKITS)}")
    return version


def converter_python(version: str = DEFAULT_TOOLKIT) -> Path:
    """The interpreter of the converter venv for `version`; a clear error if it was never created."""
    check_toolkit(version)
    python = venv_root() / f"convert-{version}" / "bin" / "python"
    if not python.exists():
        raise SetupError(
            f"no converter venv for rknn-toolkit2 {version} at {python.parent.parent}; "
            f"create it with: make venvs RKNN_TOOLKIT={version}"
        )
    return python
