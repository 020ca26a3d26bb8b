"""`convert build` (any fixed-shape ONNX -> gated .rknn + manifest) and `convert inspect` (manifest summary)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from converters.options import FailOnCpuOps, MaxRegtaskLines, OutDir, Target, Toolkit
from converters.toolkit import DEFAULT_TOOLKIT


def build(
    onnx_path: Annotated[Path, typer.Argument(metavar="ONNX", help="Fixed-shape ONNX to compile (every input "
                                              "dimension a number; its rkaudio contract, if any, goes into the manifest).")],
    target: Target,
    out: OutDir = Path("."),
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    max_regtask_lines: MaxRegtaskLines = 100_000,
    fail_on_cpu_ops: FailOnCpuOps = False,
    selfcheck: Annotated[Optional[Path], typer.Option(
        "--selfcheck", help="Inputs for the simulator check: an .npz whose keys are the ONNX input names. "
        "Default: standard-normal inputs (seed 0) for float inputs, zeros for integer inputs.")] = None,
    min_snr: Annotated[float, typer.Option(
        "--min-snr", help="Fail when the simulator's output is below this SNR (dB) against onnxruntime fp32.")] = 35.0,
    timeout: Annotated[Optional[float], typer.Option(
        "--timeout", help="Kill the compiler child after this many seconds (reported as a failed stage).")] = None,
) -> None:
    """Compile an ONNX to an fp16 .rknn in the converter venv, gate it (REGTASK lines, CPU ops, simulator SNR)
    and write <stem>.rknn, <stem>.manifest.json and <stem>.build.log into --out."""
    import tempfile

    import numpy as np
    import onnx

    from converters.engine import BuildError, BuildOptions, build_engine, graph_io, random_feeds
    from converters.toolkit import SetupError, check_target
    from gates.manifest import summary_lines

    check_target(target)
    if not onnx_path.is_file():
        raise SetupError(f"no ONNX at {onnx_path}")
    options = BuildOptions(target=target, toolkit=toolkit, max_regtask_lines=max_regtask_lines,
                           fail_on_cpu_ops=fail_on_cpu_ops, min_simulator_snr_db=min_snr, timeout_s=timeout)
    with tempfile.TemporaryDirectory(prefix="rkaudio-selfcheck-") as scratch:
        if selfcheck is None:
            inputs, _ = graph_io(onnx.load(str(onnx_path), load_external_data=False))
            selfcheck = Path(scratch) / "inputs.npz"
            np.savez(selfcheck, **random_feeds(inputs))
        typer.echo(f"building {onnx_path.name} for {target} with rknn-toolkit2 {toolkit} ...", err=True)
        try:
            result = build_engine(onnx_path, out, options, selfcheck=selfcheck)
        except BuildError as error:  # a dead or failing child: its message names the stage and the log
            typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
            raise typer.Exit(4) from None
    typer.echo("\n".join(summary_lines(result.manifest_data)))
    typer.echo(f"wrote {result.rknn}, {result.manifest.name}, {result.build_log.name}")


def inspect(
    path: Annotated[Path, typer.Argument(metavar="ENGINE_OR_MANIFEST",
                                         help="An .rknn built by rkaudio (its manifest sits beside it) or the manifest.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole manifest as JSON.")] = False,
) -> None:
    """Print an engine's manifest summary: target, toolkit, I/O, bytes, REGTASK, op placement, gates, exec_plan."""
    import json

    from gates.manifest import read_manifest, summary_lines

    data = read_manifest(path)
    typer.echo(json.dumps(data, indent=2) if as_json else "\n".join(summary_lines(data)))


def register(app: typer.Typer, check_app: typer.Typer) -> None:
    app.command("build")(build)
    app.command("inspect")(inspect)
