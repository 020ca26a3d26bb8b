"""Command-line options every command shares, declared once so their help text reads the same. The target is
normalised here, at the boundary (`--target RK3588` is rk3588 everywhere after), and the shared gate options are
made from `rkaudio.pipeline.declaration.BuildGates`, which also declares them as recipe `[gates]` keys."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rkaudio.board.soc import FP16_TARGETS, Target
from rkaudio.toolkit.versions import Toolkit


def normalised_target(value: str | None) -> Target | None:
    """The typed target, or a clean error (exit 2) naming the supported ones."""
    return None if value is None else Target(value)


def checked_toolkit(value: str | None) -> Toolkit | None:
    """The typed toolkit version, or a clean error (exit 2) naming the supported ones."""
    return None if value is None else Toolkit(value)


TargetOption = Annotated[
    str,
    typer.Option("--target", "-t", callback=normalised_target,
                 help=f"SoC the engine is compiled for: {', '.join(FP16_TARGETS)}. rv1106 is refused (no fp16 build)."),
]
ToolkitOption = Annotated[
    str,
    typer.Option("--toolkit", callback=checked_toolkit,
                 help="rknn-toolkit2 version that compiles (its converter venv must exist). "
                 "The board's librknnrt must not be older than this.", envvar="RKAUDIO_TOOLKIT"),
]
OutDir = Annotated[
    Path,
    typer.Option("--out", "-o", help="Directory for the ONNX, engine, build log and manifest."),
]
SkipRknn = Annotated[
    bool,
    typer.Option("--skip-rknn", help="Stop after the export stage: write the ONNX and its self-check, "
                 "build no engine (no converter venv needed)."),
]
FromOnnx = Annotated[
    Optional[Path],
    typer.Option("--onnx", help="Skip the export: compile this ONNX written earlier by the same command "
                 "with --skip-rknn. Its contract (shapes, window, cache) is read from the ONNX metadata."),
]


def gate_option(name: str):
    """The typer option of shared build gate `name` (a `BuildGates` field): its flag and help text."""
    from rkaudio.pipeline.declaration import BuildGates, field_extra

    info = BuildGates.model_fields[name]
    flag = field_extra(BuildGates, name)["flag"] or "--" + name.replace("_", "-")
    return Annotated[info.annotation, typer.Option(flag, help=info.description)]


MaxRegtaskLines = gate_option("max_regtask_lines")
FailOnCpuOps = gate_option("fail_on_cpu_ops")
MaxCpuOps = gate_option("max_cpu_ops")
MaxRealTimeFactor = gate_option("max_real_time_factor")
MinSnrDb = gate_option("min_simulator_snr_db")
