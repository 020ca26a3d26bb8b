"""Which toolkit builds, for which target, from which converter venv. Stdlib only."""
from __future__ import annotations

from pathlib import Path

from core.errors import SetupError
from core.paths import venv_root

# 2.3.2 by default: a board's librknnrt refuses engines built by a newer toolkit
# ("Invalid RKNN model version"), and the spec's boards run api 2.3.2.
DEFAULT_TOOLKIT = "2.3.2"
SUPPORTED_TOOLKITS = ("2.3.2", "2.5.0")

# Targets that build fp16 (w16a16) with both toolkits (measured on this machine kind).
FP16_TARGETS = ("rk3588", "rk3576", "rk3566", "rk3568", "rk3562")
REFUSED_TARGETS = {
    "rv1106": "rv1106 has no fp16 build (the toolkit says 'not support do_quantization = False'); "
    "rkaudio builds fp16 engines only, because Snake activations make int8 audibly noisy",
    "rv1103": "rv1103 has no fp16 build (same NPU generation as rv1106); rkaudio builds fp16 engines only",
}


def check_target(target: str) -> str:
    target = target.lower()
    if target in REFUSED_TARGETS:
        raise SetupError(f"target {target} refused: {REFUSED_TARGETS[target]}")
    if target not in FP16_TARGETS:
        raise SetupError(f"unknown target {target!r}; supported: {', '.join(FP16_TARGETS)}")
    return target


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
