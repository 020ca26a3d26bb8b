"""`convert example`: a tiny built-in conv graph (Conv1d -> ReLU -> Conv1d, random weights from a seed).

It needs no checkpoint, so it proves export -> build -> gates -> manifest -> package on a fresh machine,
and it is the template of a family: one `export` writes the ONNX (its contract made by `job.contract` from the
family's own typed fields, `ConvFields`) and returns its `Exported` records, and `FAMILY` declares the rest
(source, options, the component's export), from which the `convert example` command and the recipe adapter are
made."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from rkaudio.pipeline.declaration import Component, Family, Table, option
from rkaudio.board.ladder import RungWidth

# fp32 torch against fp32 onnxruntime: only rounding-order noise (~140 dB); less means the export changed the graph.
MIN_EXPORT_SNR_DB = 100.0


class Source(Table):
    seed: int = option(0, "Seed of the random weights and of the self-check input.")


@dataclass(frozen=True)
class ConvFields(RungWidth):
    """The engine's own contract fields: its rung of the ladder (`frames`, what the ladder loop reads) and its
    channels."""

    channels: int  # channels of both convolutions (the input's and the output's)


class Options(Table):
    frames: list[int] = option([128], "Fixed lengths of the time axis, comma-separated: one engine each (a ladder "
                               "ordered by frames).", min_length=1)
    channels: int = option(16, "Channels of both convolutions.", ge=1)


def _model(channels: int, seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv1d(channels, channels, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv1d(channels, channels, 3, padding=1),
    ).eval()


def export(job, frames: int) -> list:
    """Write `example_c<C>_t<T>.onnx` (fixed [1, C, T] at T = `frames`, C = `job.options.channels`, the weights from
    `job.source.seed`, its contract in the metadata) into `job.out` with its self-check inputs; its export verdicts
    are torch vs onnxruntime SNR and the problem-op scan for `job.target`."""
    import numpy as np
    import onnx
    import torch

    from rkaudio.pipeline.pipeline import record_export
    from rkaudio.core.contract import set_contract
    from rkaudio.gates import opscan
    from rkaudio.gates.snr import snr_verdict
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.surgery.graph.fold import fold_fixed

    channels, seed = job.options.channels, job.source.seed
    out_dir = Path(job.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / f"example_c{channels}_t{frames}.onnx"
    model = _model(channels, seed)
    x = np.random.default_rng(seed).standard_normal((1, channels, frames)).astype(np.float32)
    with warnings.catch_warnings():
        # The legacy exporter is deliberate: dynamo writes opset 18 even when asked for 17.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(model, (torch.from_numpy(x),), str(onnx_path), input_names=["x"], output_names=["y"],
                          opset_version=17, dynamo=False)
    contract = job.contract("main", ladder_key=frames, **ConvFields(frames=frames, channels=channels).to_fields())
    exported = set_contract(fold_fixed(onnx.load(str(onnx_path))), contract)
    onnx.save(exported, str(onnx_path))

    with torch.no_grad():
        reference = model(torch.from_numpy(x)).numpy()
    got = OnnxBackend(onnx_path).run({"x": x})["y"]
    problems = opscan.scan(exported, job.target)
    opscan.warn(problems)
    verdicts = [snr_verdict("export_snr", reference, got, MIN_EXPORT_SNR_DB, "onnxruntime vs torch fp32"),
                opscan.verdict(problems)]
    return [record_export(onnx_path, verdicts, feeds={"x": x})]


def with_end_to_end(exported: list, channels: int, seed: int) -> list:
    """The family's end-to-end golden: one chunk per rung, three quarters of its width, through the ladder."""
    import numpy as np

    from rkaudio.pipeline import pipeline
    from rkaudio.core.contract import contract_of

    rng = np.random.default_rng(seed + 1)
    widths = sorted(RungWidth.of(contract_of(record.onnx)).frames for record in exported)
    inputs = {f"x@{k}": rng.standard_normal((1, channels, width - width // 4)).astype(np.float32)
              for k, width in enumerate(widths)}
    return pipeline.record_end_to_end("example_ladder", "rkaudio.board.ladder:golden_loop", exported, inputs,
                                      {"width_key": "frames", "axis": -1},
                                      "one chunk per rung (3/4 of its width), right-padded, through the ladder")


def export_ladder(job) -> list:
    """One engine per `frames` entry (a ladder ordered by frames), the weights from `source.seed`."""
    exported = []
    for frames in job.options.frames:
        print(f"  export example c{job.options.channels} t{frames}, build for {job.target}", flush=True)
        exported += export(job, frames)
    return with_end_to_end(exported, job.options.channels, job.source.seed)


FAMILY = Family(
    name="example",
    help="Export the built-in example conv graph and compile it: the smoke test of the whole path.",
    source=Source,
    components=(Component("conv", export_ladder, "example.exec_plan", Options, context="example export",
                          ladder=("main",)),),
    sources=lambda job: [],  # no checkpoint: the weights come from `source.seed`, part of the recipe itself
    loops=("rkaudio.board.ladder:golden_loop",),
)
