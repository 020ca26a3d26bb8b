"""`convert example`: a tiny built-in conv graph (Conv1d -> ReLU -> Conv1d, random weights from a seed).

It needs no checkpoint, so it proves export -> build -> gates -> manifest -> package on a fresh machine,
and it is the template of a family: one `export` writes the ONNX and returns its `Exported` records,
`convert_example` and `build_recipe` are thin adapters over `converters.family.pipeline`, `register` adds the
command to the CLI."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated

import typer

from converters.cli.options import (FailOnCpuOps, FromOnnx, MaxRegtaskLines, MinSnrDb, OutDir, SkipRknn, Target,
                                Toolkit)
from core.errors import SetupError
from core.paths import work_dir
from toolkit.versions import DEFAULT_TOOLKIT

FAMILY = "example"
COMPONENT = "conv"
EXEC_PLAN_OPTION = "example.exec_plan"
# fp32 torch against fp32 onnxruntime: only rounding-order noise (~140 dB); less means the export changed the graph.
MIN_EXPORT_SNR_DB = 100.0

Frames = Annotated[int, typer.Option("--frames", help="Fixed length of the time axis the engine is built for.")]
Channels = Annotated[int, typer.Option("--channels", help="Channels of both convolutions.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the random weights and of the self-check input.")]


def _model(channels: int, seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv1d(channels, channels, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv1d(channels, channels, 3, padding=1),
    ).eval()


def export(out_dir: Path, channels: int, frames: int, seed: int, target: str | None = None) -> list:
    """Write `example_c<C>_t<T>.onnx` (fixed [1, C, T], contract in its metadata) and its self-check inputs;
    its export verdicts are torch vs onnxruntime SNR and the problem-op scan for `target`."""
    import numpy as np
    import onnx
    import torch

    from converters.family.pipeline import record_export
    from core.contract import make_contract, set_contract
    from gates import opscan
    from gates.snr import snr_verdict
    from runtime.host.backends import OnnxBackend
    from surgery.graph.fold import fold_fixed

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / f"example_c{channels}_t{frames}.onnx"
    model = _model(channels, seed)
    x = np.random.default_rng(seed).standard_normal((1, channels, frames)).astype(np.float32)
    with warnings.catch_warnings():
        # The legacy exporter is deliberate: dynamo writes opset 18 even when asked for 17.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(model, (torch.from_numpy(x),), str(onnx_path), input_names=["x"], output_names=["y"],
                          opset_version=17, dynamo=False)
    contract = make_contract(FAMILY, COMPONENT, "main", EXEC_PLAN_OPTION, ladder_key=frames,
                             frames=frames, channels=channels)
    exported = set_contract(fold_fixed(onnx.load(str(onnx_path))), contract)
    onnx.save(exported, str(onnx_path))

    with torch.no_grad():
        reference = model(torch.from_numpy(x)).numpy()
    got = OnnxBackend(onnx_path).run({"x": x})["y"]
    problems = opscan.scan(exported, target)
    opscan.warn(problems)
    verdicts = [snr_verdict("export_snr", reference, got, MIN_EXPORT_SNR_DB, "onnxruntime vs torch fp32"),
                opscan.verdict(problems)]
    return [record_export(onnx_path, verdicts, feeds={"x": x})]


def with_end_to_end(exported: list, channels: int, seed: int) -> list:
    """The family's end-to-end golden: one chunk per rung, three quarters of its width, through the ladder."""
    import numpy as np

    from converters.family import pipeline
    from core.contract import get_contract

    rng = np.random.default_rng(seed + 1)
    widths = sorted(int(get_contract(record.onnx)["frames"]) for record in exported)
    inputs = {f"x@{k}": rng.standard_normal((1, channels, width - width // 4)).astype(np.float32)
              for k, width in enumerate(widths)}
    return pipeline.record_end_to_end("example_ladder", "runtime.board.ladder:golden_loop", exported, inputs,
                                      {"width_key": "frames", "axis": -1},
                                      "one chunk per rung (3/4 of its width), right-padded, through the ladder")


def recipe_sources(recipe: dict) -> list:
    """No checkpoint: the weights come from `source.seed`, which is part of the recipe itself."""
    return []


def build_recipe(recipe: dict, target: str, toolkit: str, work_dir: Path) -> list:
    """One engine per entry of `options.frames` (a ladder ordered by frames); `source.seed` gives the weights."""
    from converters.family import pipeline

    options = recipe["options"]
    frames_list = options.get("frames", [])
    frames_list = frames_list if isinstance(frames_list, list) else [frames_list]
    if not frames_list or "channels" not in options or "seed" not in recipe["source"]:
        raise SetupError(f"recipe {recipe['path']}: the example family needs options.frames, options.channels "
                         "and source.seed")
    exported = []
    for frames in frames_list:
        print(f"  export example c{options['channels']} t{frames}, build for {target}", flush=True)
        exported += export(work_dir, options["channels"], frames, recipe["source"]["seed"], target)
    exported = with_end_to_end(exported, options["channels"], recipe["source"]["seed"])
    return pipeline.build_recipe(recipe, target, toolkit, work_dir, exported)


def convert_example(
    target: Target = "rk3588",
    toolkit: Toolkit = DEFAULT_TOOLKIT,
    out: OutDir = work_dir(FAMILY),
    frames: Frames = 128,
    channels: Channels = 16,
    seed: Seed = 0,
    skip_rknn: SkipRknn = False,
    from_onnx: FromOnnx = None,
    max_regtask_lines: MaxRegtaskLines = 100_000,
    fail_on_cpu_ops: FailOnCpuOps = False,
    min_snr_db: MinSnrDb = 35.0,
) -> None:
    """Export the built-in example conv graph and compile it: the smoke test of the whole path."""
    from converters.family import pipeline

    pipeline.convert(FAMILY, lambda: with_end_to_end(export(out, channels, frames, seed, target), channels, seed),
                     from_onnx=from_onnx,
                     skip_rknn=skip_rknn, out=out, target=target, toolkit=toolkit,
                     max_regtask_lines=max_regtask_lines, fail_on_cpu_ops=fail_on_cpu_ops, min_snr_db=min_snr_db,
                     context="example export")


def register(app: typer.Typer, check_app: typer.Typer) -> None:
    app.command("example")(convert_example)
