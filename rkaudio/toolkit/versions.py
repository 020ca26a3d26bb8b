"""Which toolkit builds, from which converter venv (the targets are `rkaudio.board.soc`). Stdlib only."""
from __future__ import annotations

from pathlib import Path

from rkaudio.core.errors import SetupError
from rkaudio.core.paths import venv_root

# 2.3.2 by default: a board's librknnrt refuses engines built by a newer toolkit
# ("Invalid RKNN model version"), and the spec's boards run api 2.3.2.
DEFAULT_TOOLKIT = "2.3.2"
SUPPORTED_TOOLKITS = ("2.3.2", "2.5.0")


class Toolkit(str):
    """An rknn-toolkit2 version as every step after its entry (a command's --toolkit, a Python API object) takes it:
    a supported one. `Toolkit(version)` is the one check; a Toolkit passes through unchanged."""

    def __new__(cls, version: str) -> "Toolkit":
        if isinstance(version, Toolkit):
            return version
        if version not in SUPPORTED_TOOLKITS:
            raise SetupError(f"unknown rknn-toolkit2 version {version!r}; supported: {', '.join(SUPPORTED_TOOLKITS)}")
        return super().__new__(cls, version)


def converter_python(version: Toolkit = Toolkit(DEFAULT_TOOLKIT)) -> Path:
    """The interpreter of the converter venv for `version`; a clear error if it was never created."""
    python = venv_root() / f"convert-{version}" / "bin" / "python"
    if not python.exists():
        raise SetupError(
            f"no converter venv for rknn-toolkit2 {version} at {python.parent.parent}; "
            f"create it with: make venvs RKNN_TOOLKIT={version}"
        )
    return python
