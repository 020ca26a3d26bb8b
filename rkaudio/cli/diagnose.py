"""`convert diagnose`: the command over `rkaudio.engine.diagnose` (where along the graph an engine loses
fidelity: rknn-toolkit2's accuracy_analysis in the simulator, a ranked per-layer table and a PNG)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rkaudio.cli.options import TargetOption, ToolkitOption
from rkaudio.toolkit.versions import DEFAULT_TOOLKIT


def diagnose(
    path: Annotated[Path, typer.Argument(metavar="ONNX_OR_ENGINE_DIR", help="A fixed-shape ONNX, or a directory "
                    "of engines with their ONNX (work/dist/<target>/<package>/ as `convert engines` keeps it, or a "
                    "package whose manifests name their ONNX).")],
    target: TargetOption,
    toolkit: ToolkitOption = DEFAULT_TOOLKIT,
    selfcheck: Annotated[Optional[Path], typer.Option("--selfcheck", help="Inputs for the analysis: an .npz keyed "
                         "by the ONNX input names. Default: the <stem>.selfcheck.npz beside the ONNX, else "
                         "standard-normal inputs (seed 0).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Where the PNG and the table JSON go "
                   "(default: beside the ONNX).")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows to print.")] = 10,
) -> None:
    """Per-layer error table of an engine: rknn-toolkit2's accuracy_analysis in the simulator (no device), layers
    mapped back to ONNX nodes and stages, ranked by the noise each adds; writes a PNG of the error along depth."""
    from rkaudio.engine.diagnose import diagnose_source, report_lines, resolve

    for source in resolve(path, selfcheck):
        typer.echo(f"analysing {source.onnx.name} for {target} with rknn-toolkit2 {toolkit} ...", err=True)
        diagnosis = diagnose_source(source, target, toolkit, out or source.onnx.parent, top)
        typer.echo("\n".join(report_lines(diagnosis, top)))
