"""Command-line options every family shares, declared once so their help text reads the same."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from toolkit.versions import FP16_TARGETS

Target = Annotated[
    str,
    typer.Option("--target", "-t", help=f"SoC the engine is compiled for: {', '.join(FP16_TARGETS)}. "
                 "rv1106 is refused (no fp16 build)."),
]
Toolkit = Annotated[
    str,
    typer.Option("--toolkit", help="rknn-toolkit2 version that compiles (its converter venv must exist). "
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
MaxRegtaskLines = Annotated[
    int,
    typer.Option("--max-regtask-lines", help="Fail the build past this many REGTASK field-overflow lines "
                 "(an axis longer than an op's register field; a few hundred are benign on some SoCs)."),
]
FailOnCpuOps = Annotated[
    bool,
    typer.Option("--fail-on-cpu-ops", help="Fail if the layer table places any compute op on the CPU "
                 "(Input/OutputOperator and their rank-adapting Reshapes do not count)."),
]
MinSnrDb = Annotated[
    float,
    typer.Option("--min-snr-db", help="Fail when the simulator's output is below this SNR (dB) against "
                 "onnxruntime fp32 (the exact fp32 twin where the engine graph has one)."),
]
