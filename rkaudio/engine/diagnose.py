"""Where along the graph an engine loses fidelity (what `convert diagnose`, rkaudio/cli/diagnose.py, runs).
rknn-toolkit2's accuracy_analysis runs in the converter-venv child (simulator, no device; the child reduces its
tensor dumps to per-layer energies and deletes them), `rkaudio.gates.layer_error` ranks the layers by the noise they add,
and a PNG plots the error along the graph's depth. The same analysis (`rkaudio.engine.analysis`) runs inside
`build_engine` when the simulator gate fails, in the child session that built the engine.

The toolkit's golden is the engine graph run in fp32: for a graph that relies on fp16 arithmetic (an fp32 twin,
`reference_onnx`, exists; e.g. the round-form Snake sine) that golden is not the model, and the table says so.

onnx / numpy / matplotlib are imported inside functions so `convert --help` stays fast."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rkaudio.engine.analysis import analyse_in_child, checked_feeds
from rkaudio.core.errors import SetupError

FP16_MATHS_CAVEAT = ("caveat: this graph relies on fp16 arithmetic (its fp32 twin {twin} is the reference the "
                     "build gates against); the toolkit's golden is the engine graph in fp32, so the per-layer "
                     "figures measure the simulator against that graph, not against the model")
PNG_SUFFIX = ".layer_error.png"
JSON_SUFFIX = ".layer_error.json"


@dataclass
class EngineSource:
    """One engine's ONNX and what sits beside it."""
    onnx: Path
    selfcheck: Path | None = None
    reference: Path | None = None  # the fp32 twin, for graphs relying on fp16 maths
    manifest: dict | None = None


@dataclass
class Diagnosis:
    source: EngineSource
    rows: list  # rkaudio.gates.layer_error.LayerError, graph order
    outputs: dict = field(default_factory=dict)  # output name -> its row (or None)
    png: Path | None = None
    table_json: Path | None = None
    caveat: str | None = None


def _source_for(onnx_path: Path, manifest: dict | None = None, selfcheck: Path | None = None) -> EngineSource:
    from rkaudio.core.contract import contract_of
    from rkaudio.core.onnx_graph import load_model
    from rkaudio.core.paths import selfcheck_path

    contract = contract_of(load_model(onnx_path, load_external_data=False))
    twin = onnx_path.parent / contract.reference_onnx if contract.reference_onnx else None
    found = selfcheck if selfcheck is not None else selfcheck_path(onnx_path)
    return EngineSource(onnx_path, found if found.is_file() else None, twin, manifest)


def resolve(path: Path, selfcheck: Path | None = None) -> list[EngineSource]:
    """The engines behind ONNX_OR_ENGINE_DIR: an ONNX file; a work dir (work/dist/<target>/<pkg>/, the ONNX beside
    its manifest and self-check); or a package dir whose manifests name their ONNX relatively."""
    import json

    path = Path(path)
    if path.is_file() and path.suffix == ".onnx":
        return [_source_for(path, None, selfcheck)]
    if not path.is_dir():
        raise SetupError(f"{path}: neither an ONNX file nor a directory of engines")
    sources = []
    for manifest_path in sorted(path.glob("*.manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        onnx_path = (path / manifest["onnx"]["path"]).resolve()
        if not onnx_path.is_file():
            onnx_path = path / Path(manifest["onnx"]["path"]).name
        if not onnx_path.is_file():
            raise SetupError(f"{manifest_path.name} names the ONNX {manifest['onnx']['path']}, which is not there: "
                             "diagnose the work directory `convert engines` keeps (work/dist/<target>/<package>/)")
        sources.append(_source_for(onnx_path, manifest, selfcheck))
    if not sources:
        twins = set()
        onnx_files = sorted(path.glob("*.onnx"))
        for onnx_path in onnx_files:
            twins |= {s.reference.name for s in [_source_for(onnx_path)] if s.reference}
        sources = [_source_for(p, None, selfcheck) for p in onnx_files if p.name not in twins]
    if not sources:
        raise SetupError(f"{path}: no engine manifest and no ONNX in it")
    return sources


def plot_depth(rows: list, png: Path, title: str, top: list) -> Path:
    """Entire and single-layer SNR (dB, against the toolkit's golden) along the IR graph's depth; the top rows
    marked. matplotlib (Agg) from the export venv."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def finite(values):
        return [v if math.isfinite(v) else math.nan for v in values]

    depth = [row.depth for row in rows]
    figure, axis = plt.subplots(figsize=(11, 4.5), dpi=100)
    axis.plot(depth, finite([row.entire_snr_db for row in rows]), label="entire (errors accumulate)", lw=1.4)
    axis.plot(depth, finite([row.single_snr_db for row in rows]), label="single (the layer alone)", lw=0.8,
              alpha=0.7)
    for rank, row in enumerate(top, 1):
        if math.isfinite(row.entire_snr_db):
            axis.plot([row.depth], [row.entire_snr_db], "rv")
            axis.annotate(str(rank), (row.depth, row.entire_snr_db), textcoords="offset points", xytext=(0, 6),
                          ha="center", color="red", fontsize=8)
    axis.set_xlabel("IR layer (graph depth)")
    axis.set_ylabel("SNR vs toolkit fp32 golden (dB)")
    axis.set_title(title, fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    figure.savefig(png)
    plt.close(figure)
    return Path(png)


def diagnose_source(source: EngineSource, target: str, toolkit: str, out_dir: Path, top: int = 10,
                    timeout_s: float | None = None) -> Diagnosis:
    """Build `source.onnx` in the simulator child, run accuracy_analysis on its self-check (standard-normal
    inputs, seed 0, without one), and write the table JSON and the PNG into `out_dir`."""
    import json

    import numpy as np

    from rkaudio.core.contract import contract_of
    from rkaudio.core.onnx_graph import load_model
    from rkaudio.gates.layer_error import output_row, ranked
    from rkaudio.toolkit.session import ConverterChild, graph_io, random_feeds

    model = load_model(source.onnx)
    specs, outputs = graph_io(model)
    if source.selfcheck is not None:
        with np.load(source.selfcheck) as data:
            feeds = {name: data[name] for name in data.files}
    else:
        feeds = random_feeds(specs)
    feeds = checked_feeds(specs, feeds, f"self-check {source.selfcheck}")
    stages = contract_of(model).stages
    with ConverterChild(source.onnx, target, toolkit, None, rknn_path=None, simulate=True,
                        timeout_s=timeout_s) as child:
        child.wait_ready()
        rows = analyse_in_child(child, feeds, model, stages)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = source.onnx.stem
    caveat = FP16_MATHS_CAVEAT.format(twin=source.reference.name) if source.reference else None
    diagnosis = Diagnosis(source, rows, {spec.name: output_row(rows, spec.name) for spec in outputs}, caveat=caveat)
    diagnosis.table_json = out_dir / f"{stem}{JSON_SUFFIX}"
    diagnosis.table_json.write_text(json.dumps({
        "onnx": str(source.onnx), "target": target, "toolkit": toolkit, "caveat": caveat,
        "selfcheck": str(source.selfcheck) if source.selfcheck else "standard normal, seed 0",
        "outputs": {name: (row.to_json() if row else None) for name, row in diagnosis.outputs.items()},
        "layers": [row.to_json() for row in rows]}, indent=1) + "\n")
    title = f"{stem} ({target}, rknn-toolkit2 {toolkit}): simulator vs toolkit golden per layer"
    if caveat:
        title += "\nrelies on fp16 maths: the golden is this graph in fp32, not the model (see the caveat)"
    diagnosis.png = plot_depth(rows, out_dir / f"{stem}{PNG_SUFFIX}", title, ranked(rows, 5))
    return diagnosis


def report_lines(diagnosis: Diagnosis, top: int = 10) -> list[str]:
    """The printed report: the ranked table, each output's row against the manifest's simulator SNR, the caveat."""
    from rkaudio.gates.layer_error import format_rows, ranked

    lines = [f"{diagnosis.source.onnx.name}: {len(diagnosis.rows)} IR layers, the {top} adding the most noise "
             "(dB vs the toolkit's fp32 golden; added = noise the layer adds relative to its signal):"]
    lines += ["  " + line for line in format_rows(ranked(diagnosis.rows, top))]
    simulator = (diagnosis.source.manifest or {}).get("simulator", {})
    for name, row in diagnosis.outputs.items():
        recorded = simulator.get(name, {})
        at_build = recorded.get("snr_db")
        floor = recorded.get("fp16_floor_snr_db")
        text = f"  output {name}: {row.entire_snr_db:.2f} dB at the last layer" if row else f"  output {name}: no row"
        if at_build is not None:
            text += f"; manifest simulator SNR {float(at_build):.2f} dB"
        if floor is not None:
            text += f", fp16 floor {float(floor):.2f} dB"
        lines.append(text)
    if diagnosis.caveat:
        lines.append("  " + diagnosis.caveat)
    lines.append(f"  wrote {diagnosis.png} and {diagnosis.table_json.name}")
    return lines
