"""The engine build: gate the ONNX, compile it in the converter-venv child (`rkaudio.toolkit.session`), gate the
child's log and its simulator outputs, write `<stem>.rknn`, `<stem>.manifest.json` and `<stem>.build.log`.
A failing gate leaves no .rknn and no manifest (the log stays).

onnx / numpy are imported inside functions so `convert --help` stays fast."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rkaudio.engine.analysis import analyse_in_child, checked_feeds
from rkaudio.core.errors import BuildError, GateFailure
from rkaudio.core.paths import build_log_name, engine_name, manifest_name
from rkaudio.board.contract import EngineContract
from rkaudio.board.shapes import keyed, matching_set, of_set, shape_sets
from rkaudio.board.verdict import Verdict
from rkaudio.gates.real_time import RealTime
from rkaudio.toolkit.session import ConverterChild, graph_io, log_tail
from rkaudio.board.soc import Target
from rkaudio.toolkit.versions import DEFAULT_TOOLKIT, Toolkit


@dataclass
class BuildOptions:
    target: str
    toolkit: str = DEFAULT_TOOLKIT
    # 0: a REGTASK line is a register field written past its width, which corrupts the engine on a board (Kokoro at
    # 3.75x its field gave voiced clipped noise) where the simulator shows nothing. Every command's default is this one.
    max_regtask_lines: int = 0
    fail_on_cpu_ops: bool = False
    max_cpu_ops: int | None = None  # fail past this many CPU compute ops (fail_on_cpu_ops: 0); None: not gated
    # fail an engine that keeps a CPU op past this predicted board time per second of real time
    # (rkaudio.gates.real_time; 1.0: slower than real time); None: not gated
    max_real_time_factor: float | None = 1.0
    # the real time one call of an engine covers, from its contract: its family's declaration (`Family.real_time`,
    # set by the pipeline); None: the gate says it is not judged
    real_time: Callable[[EngineContract], RealTime | None] | None = None
    min_simulator_snr_db: float = 35.0
    timeout_s: float | None = None  # the child is killed with SIGKILL past this (reported like any signal)
    reproduce: bool = False  # compile a second time and fail unless both engines are byte-identical
    layer_table_on_failure: bool = True  # a failing simulator gate runs accuracy_analysis for its top layers

    def __post_init__(self) -> None:
        # The API boundary of every build: the target is normalised here (and by the CLI and the recipe schema
        # before), so the manifest and the child see "rk3588" for "RK3588".
        self.target = Target(self.target)
        self.toolkit = Toolkit(self.toolkit)


@dataclass
class EngineResult:
    rknn: Path
    manifest: Path
    build_log: Path
    manifest_data: dict
    verdicts: list[Verdict]
    simulator_outputs: dict = field(default_factory=dict)  # of the self-check inputs
    reference_outputs: dict = field(default_factory=dict)  # onnxruntime fp32 (on the twin, if any) of the same
    golden_simulator_outputs: list = field(default_factory=list)  # one dict per `golden_feeds` run


def simulator_verdicts(reference: dict, simulated: dict, min_snr_db: float,
                       floor: dict | None = None) -> tuple[list[Verdict], dict]:
    """Per output: SNR of the simulator against onnxruntime fp32 (gated) and max|d| (recorded). A self-check
    whose fp32 output is degenerate (all zeros, a constant, non-finite) fails: it cannot judge the engine.
    With `floor` (the fp16 floor graph's outputs, `rkaudio.gates.fp16_floor`): its SNR against the same reference and
    the gap to the simulator are recorded, and the gap is gated (`fp16_floor_gap[<output>]`)."""
    from rkaudio.gates.fp16_floor import floor_gap, floor_gap_verdict
    from rkaudio.gates.snr import snr_verdict
    from rkaudio.board.numeric import degenerate_reference, max_abs, snr_db

    verdicts, figures = [], {}
    for name, ref in reference.items():
        snr, worst = snr_db(ref, simulated[name]), max_abs(ref, simulated[name])
        figures[name] = {"snr_db": snr, "max_abs": worst}
        verdicts.append(snr_verdict(f"simulator_snr[{name}]", ref, simulated[name], min_snr_db,
                                    f"max|d| {worst:.3g} vs onnxruntime fp32", full_scale=None))
        if floor is not None and name in floor:
            floor_db = snr_db(ref, floor[name])
            figures[name].update(fp16_floor_snr_db=floor_db, fp16_floor_gap_db=floor_gap(snr, floor_db))
            if degenerate_reference(ref, full_scale=None) is None:
                verdicts.append(floor_gap_verdict(name, snr, floor_db))
    return verdicts, figures


SIMULATOR_ADVICE = ("the fp16 simulator disagrees with onnxruntime fp32: look for fp16 overflow (inf) or "
                    "precision loss (large constants, long reductions) in the graph, or lower the threshold "
                    "(min_simulator_snr_db, --min-snr) if the family's own gate accepts it")


def host_references(model, reference_onnx: Path, feeds: dict) -> tuple[dict, dict]:
    """onnxruntime fp32 of `reference_onnx` and of the fp16 floor graph of `model` (the engine graph) on `feeds`,
    one session at a time (the floor costs one more host run of the graph: seconds on the default engines)."""
    from rkaudio.gates.fp16_floor import fp16_rounded
    from rkaudio.host.backends import OnnxBackend

    with OnnxBackend(Path(reference_onnx)) as reference_graph:
        reference = reference_graph.run(feeds)
    with OnnxBackend(fp16_rounded(model)) as floor_graph:
        floor = floor_graph.run(feeds)
    return reference, floor


def simulator_advice(verdicts: list[Verdict], figures: dict, min_snr_db: float, culprits: list[str],
                     family: str | None = None) -> dict:
    """Verdict name -> advice for the simulator gates: which of "the conversion lost fidelity" and "these
    weights are fp16-sensitive" the figures say, with the layers where the error grows when known."""
    from rkaudio.gates.fp16_floor import simulator_advice as floor_advice
    from rkaudio.board.numeric import DEGENERATE_ADVICE

    advice = {}
    gap_passed = {v.name[len("fp16_floor_gap["):-1]: v.passed for v in verdicts if v.name.startswith("fp16_floor_gap[")}
    for verdict in verdicts:
        output = verdict.name[verdict.name.index("[") + 1:-1]
        figure = figures.get(output, {})
        if verdict.degenerate:
            advice[verdict.name] = DEGENERATE_ADVICE
        elif "fp16_floor_snr_db" not in figure:
            advice[verdict.name] = SIMULATOR_ADVICE
        elif not math.isfinite(figure["fp16_floor_snr_db"]):
            advice[verdict.name] = f"[{output}] plain fp16 of this graph is non-finite already: " + SIMULATOR_ADVICE
        else:
            advice[verdict.name] = floor_advice(output, figure["snr_db"], figure["fp16_floor_snr_db"],
                                                gap_passed.get(output, True), min_snr_db,
                                                culprits if not gap_passed.get(output, True) else (), family)
    return advice


@dataclass
class _Build:
    """What the prepare stage hands the others: the engine graph and its contract, the self-check inputs with their
    host figures, and the artifacts' paths."""

    onnx_path: Path
    out_dir: Path
    options: BuildOptions
    model: object  # onnx.ModelProto without its weights: the build reads names and I/O only (the child loads its own)
    contract: EngineContract
    sets: list[dict]  # the contract's shape sets: every figure per set (empty for a fixed-shape engine)
    set_names: list[str]  # the suffix of each set's tensors ([""] for a fixed-shape engine)
    constants: Verdict  # the fp16 constants gate, passed before the compile
    feeds: list[dict] | None  # the self-check inputs of each set (None: no self-check, no simulator run)
    reference: dict  # onnxruntime fp32 of the reference graph on `feeds`, by `<output><suffix>`
    floor: dict  # the fp16 floor graph's outputs on `feeds`, by the same names
    fp16_maths: bool  # the engine graph relies on fp16 arithmetic: it is judged against an fp32 twin
    final_rknn: Path
    final_manifest: Path
    log_path: Path
    partial_rknn: Path  # where the child writes the engine; renamed to `final_rknn` once every gate passed


@dataclass
class _Simulation:
    """The simulator's run in the build's child (empty without a self-check): its outputs and gates."""

    outputs: dict = field(default_factory=dict)  # on the self-check inputs, by `<output><suffix>`
    golden_outputs: list = field(default_factory=list)  # one dict per `golden_feeds` run
    figures: dict = field(default_factory=dict)  # per output: SNR and max|d| against fp32, the fp16 floor's
    verdicts: list[Verdict] = field(default_factory=list)
    advice: dict = field(default_factory=dict)  # verdict name -> what to do when it fails
    layer_note: str = ""  # the layers adding the most noise, for a failing gate's message


@dataclass
class _Compiled:
    """What the compile stage hands the judge and the record."""

    inputs: list  # the engine's input and output TensorSpecs as the child built them (a dynamic engine's largest set)
    outputs: list
    build_stats: dict  # the child's memory figures
    simulation: _Simulation


@dataclass
class _Judged:
    """The build's verdicts (every one passed) and each shape set's part of the build log, parsed."""

    verdicts: list[Verdict]
    regtask_reports: list
    tables: list
    priced: list  # per shape set: (inputs as fed, outputs as returned, predicted_board_ms, priced ops)


def build_engine(onnx_path, out_dir, options: BuildOptions, selfcheck=None, export_verdicts=(),
                 reference_onnx=None, golden_feeds=()) -> EngineResult:
    """Compile `onnx_path` for `options.target` in the converter child, gate it, write the artifacts.
    `reference_onnx`: the fp32 graph the simulator is compared with, when the engine graph relies on fp16
    arithmetic (e.g. a native fp16 rounding) and so cannot be its own fp32 reference; default `onnx_path`.
    `golden_feeds`: more inputs to run in the same simulator session (the engine calls of an end-to-end golden),
    with the self-check; their outputs come back in `golden_simulator_outputs`."""
    build = _prepare(Path(onnx_path), Path(out_dir), options, selfcheck, reference_onnx)
    try:
        compiled = _compile(build, golden_feeds)
        judged = _judge(build, compiled, export_verdicts)
        data = _record(build, compiled, judged)
    except BaseException:
        for artifact in (build.partial_rknn, build.final_rknn, build.final_manifest):
            artifact.unlink(missing_ok=True)
        raise
    return EngineResult(build.final_rknn, build.final_manifest, build.log_path, data, judged.verdicts,
                        compiled.simulation.outputs, build.reference, compiled.simulation.golden_outputs)


def _prepare(onnx_path: Path, out_dir: Path, options: BuildOptions, selfcheck, reference_onnx) -> _Build:
    """Load the graph, clear its stale artifacts, gate its fp16 constants, read its contract and run the
    self-check's host figures."""
    from rkaudio.core.contract import contract_of
    from rkaudio.core.onnx_graph import load_model, weightless
    from rkaudio.gates import fp16_range

    model = load_model(onnx_path)  # missing, unreadable, truncated or NaN-carrying: one SetupError line
    out_dir.mkdir(parents=True, exist_ok=True)
    final_rknn, final_manifest = out_dir / engine_name(onnx_path), out_dir / manifest_name(onnx_path)
    partial_rknn = out_dir / f".{final_rknn.name}.partial"
    for stale in (final_rknn, final_manifest, partial_rknn):
        stale.unlink(missing_ok=True)

    constants = fp16_range.fp16_constants_verdict(model)
    if not constants.passed:  # fail before a compile that can take minutes
        raise GateFailure([constants], advice=fp16_range.ADVICE, context=_failure_context(onnx_path, options))

    contract = contract_of(model)
    sets = shape_sets(contract)
    set_names = [keyed("", number) for number in range(len(sets))] or [""]
    feeds, reference, floor = _host_figures(model, sets, set_names, selfcheck, Path(reference_onnx or onnx_path))
    return _Build(onnx_path, out_dir, options, weightless(model), contract, sets, set_names, constants, feeds,
                  reference, floor, fp16_maths=reference_onnx is not None, final_rknn=final_rknn,
                  final_manifest=final_manifest, log_path=out_dir / build_log_name(onnx_path),
                  partial_rknn=partial_rknn)


def _failure_context(onnx_path: Path, options: BuildOptions) -> str:
    return f"{onnx_path.stem} for {options.target}"


def _host_figures(model, sets: list[dict], set_names: list[str], selfcheck,
                  reference_onnx: Path) -> tuple[list[dict] | None, dict, dict]:
    """(the self-check's inputs of each set, their fp32 reference outputs, their fp16 floor outputs), the outputs
    keyed `<output><suffix>`; (None, {}, {}) without a self-check. Run on the host first, so the child's session can
    stay open for a per-layer analysis when the simulator gates fail."""
    import numpy as np

    if selfcheck is None:
        return None, {}, {}
    with np.load(selfcheck) as data:
        stored = {name: data[name] for name in data.files}
    feeds = [checked_feeds(graph_io(model, entry)[0], of_set(stored, number) if sets else stored,
                           f"self-check {selfcheck} (keys: the ONNX input names"
                           + (f", @{number} for shape set {number})" if sets else ")"))
             for number, entry in enumerate(sets or [None])]
    reference, floor = {}, {}
    for suffix, set_feeds in zip(set_names, feeds):
        set_reference, set_floor = host_references(model, reference_onnx, set_feeds)
        reference.update({name + suffix: value for name, value in set_reference.items()})
        floor.update({name + suffix: value for name, value in set_floor.items()})
    return feeds, reference, floor


def _compile(build: _Build, golden_feeds) -> _Compiled:
    """Compile in the converter child, running the simulator on the self-check and the golden calls in its
    session."""
    options = build.options
    child = ConverterChild(build.onnx_path, options.target, options.toolkit, build.log_path,
                           rknn_path=build.partial_rknn, simulate=build.feeds is not None, timeout_s=options.timeout_s)
    simulation = _Simulation()
    with child:
        child.wait_ready()
        if build.feeds is not None:
            simulation = _simulate(build, child, golden_feeds)
        inputs, outputs = child.inputs, child.outputs
    if not build.partial_rknn.is_file():
        raise BuildError("export", "the child finished but wrote no engine", log_tail(build.log_path), build.log_path)
    build_stats = {"peak_rss_bytes": child.peak_rss_bytes, "stage_peak_rss_bytes": child.stage_peak_rss_bytes,
                   "reproducible": "byte-identical builds (MALLOC_PERTURB_ in the compiler child)"}
    return _Compiled(inputs, outputs, build_stats, simulation)


def _simulate(build: _Build, child, golden_feeds) -> _Simulation:
    """The simulator's outputs on each set's self-check inputs and on the golden calls, gated against the host
    figures; where a failing gate loses fidelity, from a per-layer analysis in the same session."""
    options = build.options
    outputs = {name + suffix: value for suffix, set_feeds in zip(build.set_names, build.feeds)
               for name, value in child.run(set_feeds).items()}
    golden_outputs = [child.run(checked_feeds(_set_inputs(build.model, build.sets, extra), extra,
                                              "an end-to-end golden call"))
                      for extra in golden_feeds]
    verdicts, figures = simulator_verdicts(build.reference, outputs, options.min_simulator_snr_db, build.floor)
    culprits, layer_note = [], ""
    if options.layer_table_on_failure and any(not v.passed and not v.degenerate for v in verdicts):
        culprits, layer_note = _layer_culprits(child, build.feeds[-1], build.model, build.contract.stages,
                                               build.fp16_maths)
    advice = simulator_advice(verdicts, figures, options.min_simulator_snr_db, culprits, build.contract.family)
    return _Simulation(outputs, golden_outputs, figures, verdicts, advice, layer_note)


def _judge(build: _Build, compiled: _Compiled, export_verdicts) -> _Judged:
    """Every verdict in the manifest's order (export, fp16 constants, REGTASK, CPU ops and real time per shape set,
    reproducibility, simulator); a GateFailure with the failing ones' advice."""
    from rkaudio.gates import layer_table, real_time, regtask

    options = build.options
    log_text = build.log_path.read_text(errors="replace")
    try:
        parts = layer_table.shape_set_logs(log_text, build.sets) if build.sets else [log_text]
        tables = [layer_table.parse_layer_table(part) for part in parts]
    except ValueError as error:
        raise BuildError("parse log", str(error), log_tail(build.log_path), build.log_path) from None
    regtask_reports = [regtask.parse_regtask(part) for part in parts]
    priced = [_priced(build, compiled, entry, table) for entry, table in zip(build.sets or [None], tables)]
    verdicts = [*export_verdicts, build.constants]
    advice = {}
    for suffix, report, table, view, (_, _, predicted, _) in zip(build.set_names, regtask_reports, tables,
                                                                 build.contract.views(), priced):
        verdicts.append(_for_set(regtask.regtask_verdict(report, options.max_regtask_lines), suffix))
        advice[verdicts[-1].name] = regtask.ADVICE
        allowed_cpu_ops = 0 if options.fail_on_cpu_ops else options.max_cpu_ops
        if allowed_cpu_ops is not None:
            verdicts.append(_for_set(layer_table.cpu_ops_verdict(table, allowed_cpu_ops), suffix))
            advice[verdicts[-1].name] = layer_table.ADVICE
        if options.max_real_time_factor is not None:
            gated = _real_time_verdict(options, view, predicted, len(table.cpu_compute))
            verdicts.append(_for_set(gated, suffix))
            advice[verdicts[-1].name] = real_time.ADVICE
    if options.reproduce:
        verdicts.append(reproduce_verdict(build.onnx_path, options, build.partial_rknn, build.out_dir))
        advice[verdicts[-1].name] = REPRODUCE_ADVICE
    simulation = compiled.simulation
    verdicts += simulation.verdicts
    advice.update(simulation.advice)
    failed = [v for v in verdicts if not v.passed]
    if failed:
        hints = list(dict.fromkeys(advice[v.name] for v in failed if v.name in advice))
        raise GateFailure(failed, advice="; ".join(hints) + simulation.layer_note,
                          context=_failure_context(build.onnx_path, options), extra={"simulator": simulation.figures})
    return _Judged(verdicts, regtask_reports, tables, priced)


def _priced(build: _Build, compiled: _Compiled, entry: dict | None, table) -> tuple:
    """One shape set's (inputs as fed, outputs as returned, predicted_board_ms, its ops with each CPU op priced)."""
    from rkaudio.core.contract import fed_inputs
    from rkaudio.gates import board_time

    set_inputs, set_outputs = graph_io(build.model, entry) if entry else (compiled.inputs, compiled.outputs)
    fed = fed_inputs([spec.to_json() for spec in set_inputs], build.contract)
    returned = [spec.to_json() for spec in set_outputs]
    target = build.options.target
    return (fed, returned, board_time.predict(board_time.CallFigures.from_table(table, fed, returned), target),
            board_time.priced_ops(table, target))


def _real_time_verdict(options: BuildOptions, contract: EngineContract, predicted: dict | None,
                       cpu_ops: int) -> Verdict:
    """The real-time gate of one shape set: its prediction over the real time its contract's call covers (gated
    only where it keeps `cpu_ops` > 0 CPU ops)."""
    from rkaudio.gates.real_time import real_time_verdict

    if options.real_time is None:
        whose = f"for family {contract.family!r}" if contract.family else "(an ONNX of no rkaudio family)"
        return real_time_verdict(predicted, None, options.max_real_time_factor, cpu_ops,
                                 f"no real time per call declared {whose}")
    covered = options.real_time(contract)
    return real_time_verdict(predicted, covered, options.max_real_time_factor, cpu_ops,
                             f"family {contract.family!r} declares no real time for role {contract.role!r}")


def _record(build: _Build, compiled: _Compiled, judged: _Judged) -> dict:
    """Move the engine into place and write its manifest (a dynamic engine's top figures are its largest set's,
    every set's under `shape_sets`); the manifest's data."""
    from rkaudio.core import manifest

    os.replace(build.partial_rknn, build.final_rknn)
    per_set = [(fed, returned, report, table, predicted, ops) for report, table, (fed, returned, predicted, ops)
               in zip(judged.regtask_reports, judged.tables, judged.priced)]
    fed, returned, regtask_report, table, predicted, ops = per_set[-1]
    data = manifest.build_manifest(
        contract=build.contract,
        target=build.options.target, toolkit=build.options.toolkit, inputs=fed, outputs=returned,
        onnx_path=build.onnx_path, rknn_path=build.final_rknn, build_log=build.log_path,
        regtask_report=regtask_report, table=table, ops=ops, verdicts=judged.verdicts,
        simulator=compiled.simulation.figures, build_stats=compiled.build_stats, predicted_board_ms=predicted,
        shape_sets=[manifest.shape_set_entry(entry, *figures) for entry, figures in zip(build.sets, per_set)])
    manifest.write_manifest(build.final_manifest, data)
    return data


def _for_set(verdict: Verdict, suffix: str) -> Verdict:
    """A gate of one shape set of a dynamic engine, named `<gate>@<set>` (unchanged for a fixed-shape engine)."""
    from dataclasses import replace

    return replace(verdict, name=verdict.name + suffix) if suffix else verdict


def _set_inputs(model, sets: list[dict], feeds: dict) -> list:
    """The input specs of the shape set `feeds` has the shapes of (the engine's own for a fixed-shape engine)."""
    import numpy as np

    from rkaudio.toolkit.session import graph_io

    if not sets:
        return graph_io(model)[0]
    number = matching_set(sets, {name: np.shape(value) for name, value in feeds.items()}, "an end-to-end golden call")
    return graph_io(model, sets[number])[0]


def _layer_culprits(child, feeds: dict, model, stages: dict | None, fp16_maths: bool) -> tuple[list[str], str]:
    """The top rows of the per-layer analysis (`convert diagnose`) in the build's own child session, as
    (short names for the message, the printed table), layers grouped by the contract's `stages`; an analysis that
    fails is said, never raised."""
    from rkaudio.gates.layer_error import TOP_ROWS, culprits, format_rows, ranked

    try:
        rows = analyse_in_child(child, feeds, model, stages)
    except (BuildError, OSError, ValueError, KeyError) as error:
        return [], f"\n  (per-layer analysis unavailable: {str(error).splitlines()[0]})"
    table = "\n".join("    " + line for line in format_rows(ranked(rows, TOP_ROWS)))
    caveat = ("\n    (this graph relies on fp16 maths: the toolkit's golden is the engine graph in fp32, not its "
              "fp32 twin)") if fp16_maths else ""
    return culprits(rows, 3), (f"\n  the {TOP_ROWS} layers adding the most noise (dB vs the toolkit's fp32 golden):\n"
                               + table + caveat)


REPRODUCE_ADVICE = ("two compiles of the same ONNX gave different engines: the compiler child's environment lost "
                    "MALLOC_PERTURB_ (rkaudio/toolkit/session.py), or this toolkit version has a new source of variation")


def compile_only(onnx_path: Path, options: BuildOptions, rknn_path: Path) -> Path:
    """One more compile of `onnx_path` into `rknn_path` (no simulator, no gates): what `--reproduce` compares."""
    with ConverterChild(Path(onnx_path), options.target, options.toolkit, None, rknn_path=Path(rknn_path),
                        simulate=False, timeout_s=options.timeout_s) as child:
        child.wait_ready()
    return Path(rknn_path)


def differing_bytes(first: Path, second: Path) -> int:
    """Bytes that differ between two files (a length difference counts in full)."""
    import numpy as np

    a, b = (np.frombuffer(Path(p).read_bytes(), np.uint8) for p in (first, second))
    common = min(a.size, b.size)
    return int(np.count_nonzero(a[:common] != b[:common])) + abs(a.size - b.size)


def reproduce_verdict(onnx_path: Path, options: BuildOptions, engine: Path, out_dir: Path) -> Verdict:
    """Compile again and compare: 0 differing bytes passes."""
    from rkaudio.board.files import sha256_file
    from rkaudio.board.verdict import at_most

    again = compile_only(onnx_path, options, Path(out_dir) / f".{Path(engine).name}.again")
    try:
        changed = differing_bytes(engine, again)
        detail = f"sha256 {sha256_file(engine)[:12]} vs {sha256_file(again)[:12]} of a second compile"
    finally:
        again.unlink(missing_ok=True)
    return at_most("reproducible", changed, 0, "bytes", detail)
