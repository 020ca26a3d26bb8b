"""The window export of any decoder with a dynamic time axis: pin it at the window, mask it so a short latent's zero
padding stays zero, mend it for the target (`--fix`, the doctor's gated passes), measure the smallest context whose
interior windows match a full-length run of the dynamic graph, gate the walk, and write the window contract into the
ONNX metadata. `--window auto` builds each candidate window and keeps the one the board-time model predicts the
fewest milliseconds per emitted frame for."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rkaudio.board.contract import ContractFields
from rkaudio.core.errors import BuildError, GateFailure, SetupError
from rkaudio.engine.windowing import TimeAxis

MASK_INPUT = "mask"  # the engine's frame mask [1, 1, W]: 1 over real frames, 0 over a short latent's padding
# The self-check latent is this many windows long: a first window, interior windows at any context, a last one.
SELFCHECK_WINDOWS = 4
# The short latents of the tail gates, as fractions of the window (each one zero-padded window).
TAIL_FRACTIONS = (0.25, 0.75)
AUTO_WINDOWS = (64, 128, 256)
GOLDEN_LOOP = "rkaudio.board.window_walk:golden_loop"
GOLDEN_WINDOWS = 2.5  # the end-to-end golden's latent, in windows: a first, an interior or last, and a last window
# The pass `--fix` does not apply to a window: it would change the latent the walk slices. The placement-only passes
# apply (the problem-op scan refuses a Sin on the rk3588), where a fixed-shape `convert build --fix` weighs them.
WINDOW_SKIPS = ("input_phases",)


@dataclass(frozen=True)
class MeasuredWindow(ContractFields):
    """The export's own contract fields beside the walk's (`WindowContract`) and the output rate (`OutputRate`): the
    model the window was cut from, and the context search's worst interior window per context (dB)."""

    source_model: str
    context_search_db: dict


@dataclass
class WindowExport:
    """A written window engine graph and what its export measured."""

    onnx: Path
    emitted: int
    verdicts: list
    feeds: dict           # the build's self-check inputs: one window of the self-check latent (and its mask)
    latent_shape: list    # the latent's shape at one window
    time_axis: int        # the latent's time axis
    reference: Path | None = None  # the exact fp32 twin, when the engine graph relies on fp16 arithmetic

    def latent(self, frames: int, seed: int) -> np.ndarray:
        """A white-noise latent of `frames` frames in the engine's layout."""
        shape = list(self.latent_shape)
        shape[self.time_axis] = frames
        return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def expanded(spelt: str) -> Path:
    """A model path as a command or recipe spells it, environment variables and ~ expanded."""
    import os

    return Path(os.path.expandvars(os.path.expanduser(spelt)))


def source_model(job) -> Path:
    """The ONNX the job names (`--model`, a recipe's `model`); a SetupError when it names none or no file."""
    spelt = job.source.model
    if spelt is None:
        raise SetupError("give the model: an ONNX whose input has a dynamic time axis (convert build MODEL.onnx "
                         "--window W, or --model MODEL.onnx)")
    if not expanded(spelt).is_file():
        raise SetupError(f"no ONNX at {expanded(spelt)}")
    return expanded(spelt)


def _random_latent(axis: TimeAxis, model, frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(axis.shape(frames, model)).astype(np.float32)


def windowed_graph(model, axis: TimeAxis, window: int, tail_mask: bool):
    """The dynamic graph pinned and folded at `window` frames, with the frame mask after every conv when
    `tail_mask` (rkaudio.surgery.graph.mask.mask_decoder, fed as `MASK_INPUT`)."""
    from onnx import TensorProto, helper

    from rkaudio.surgery.graph.fold import fold_fixed
    from rkaudio.surgery.graph.mask import mask_decoder

    pinned = fold_fixed(model, {axis.input: axis.shape(window, model)})
    if not tail_mask:
        return pinned
    pinned.graph.input.append(helper.make_tensor_value_info(MASK_INPUT, TensorProto.FLOAT, [1, 1, window]))
    try:
        return fold_fixed(mask_decoder(pinned, axis.input, MASK_INPUT))
    except ValueError as error:  # upsampling levels that are no chain of ConvTransposes
        raise SetupError(f"the frame mask cannot follow this decoder's upsampling ({error}): export with "
                         "--no-tail-mask (a latent shorter than the window is then not gated)") from None


def _feeds(axis: TimeAxis, latent: np.ndarray, tail_mask: bool, window: int) -> dict:
    feeds = {axis.input: latent}
    if tail_mask:
        feeds[MASK_INPUT] = np.ones((1, 1, window), np.float32)
    return feeds


@dataclass(frozen=True)
class WalkBar:
    """The bar a walk gate holds: its own level, or lower where an approximating `--fix` pass was held lower."""

    at: float = float("inf")
    why: str = ""

    @classmethod
    def of(cls, report) -> "WalkBar":
        """The lowest bar of the approximating passes `report` (rkaudio.engine.doctor.Report) kept, if any."""
        approximating = [a for a in report.applied if a.kept and not a.exact]
        if not approximating:
            return cls()
        worst = min(approximating, key=lambda a: a.threshold_db)
        return cls(worst.threshold_db, f"; held to {worst.name}'s bar where lower (an approximating pass)")

    def gate(self, name: str, value: float, min_db: float, detail: str, against):
        from rkaudio.board.verdict import at_least, judged

        return judged(at_least(name, value, min(min_db, self.at), "dB", detail + self.why), against)


def walk_verdicts(windowed, full, axis: TimeAxis, model, latent, reference, contract, job, bar: WalkBar,
                  say=print) -> list:
    """The walk over `windowed` against full-length runs over `full`: its worst interior window and its last window
    on `latent`, and a short latent per TAIL_FRACTIONS (one padded window each; gated with the tail mask only)."""
    from rkaudio.gates.walk_vs_full import WalkBesideFull

    gates, window = job.gates, contract.window
    walked = WalkBesideFull.run(windowed, latent, contract, reference)
    interior = walked.interior()
    verdicts = [bar.gate("interior_snr_min", min(interior), gates.min_interior_db,
                         f"{len(interior)} interior window(s) of a {latent.shape[axis.axis]}-frame latent at context "
                         f"{contract.context} vs the full-length run", walked.reference)]
    last = next(row for row in walked.rows() if row["kind"] == "last")
    verdicts.append(bar.gate("last_window_snr", last["snr_db"], gates.min_tail_db,
                             "the window that reaches the latent's end vs the full-length run", walked.reference))
    for fraction in TAIL_FRACTIONS:
        frames = max(1, int(fraction * window))
        short = _random_latent(axis, model, frames, seed=frames)
        tail = WalkBesideFull.run(windowed, short, contract, full.run({axis.input: short})[axis.output])
        if contract.mask_input is not None:
            verdicts.append(bar.gate(f"tail_snr[{frames}]", tail.global_snr(), gates.min_tail_db,
                                     f"a {frames}-frame latent, one zero-padded {window}-frame window vs its "
                                     "full-length run", tail.reference))
        else:
            say(f"note: tail {frames} frames: {tail.global_snr():.1f} dB vs the full-length run (--no-tail-mask: "
                "not gated)")
    return verdicts


def export_window(job, model_path: Path, window: int, out_dir: Path, say=print) -> WindowExport:
    """Write `<stem>_w<window>.onnx` (the engine graph, its window contract in the metadata) into `out_dir` and gate
    it: every interior window of a SELFCHECK_WINDOWS-window latent against the full-length run of the dynamic graph
    at `min_interior_db`, short latents (one padded window each) at `min_tail_db`, the problem-op scan, and each
    `--fix` pass against the graph before it."""
    import onnx

    from rkaudio.board.numeric import json_safe
    from rkaudio.core.contract import set_contract
    from rkaudio.core.onnx_graph import load_model
    from rkaudio.core.paths import reference_path
    from rkaudio.engine import doctor
    from rkaudio.engine import windowing
    from rkaudio.gates import opscan
    from rkaudio.gates.real_time import OutputRate
    from rkaudio.host.backends import OnnxBackend

    options, gates = job.options, job.gates
    model = load_model(model_path)
    axis = windowing.time_axis(model, options.time_axis)
    windowing.refuse_whole_axis(model, axis, window, model_path.name)
    if axis.rank != 3:
        raise SetupError(f"input {axis.input} has rank {axis.rank}: a window walk slices a [1, channels, frames] "
                         "latent (or [1, frames, channels] with --time-axis NAME:1)")
    full = OnnxBackend(model)
    hop = windowing.hop_of(full, axis, model, window)
    latent = _random_latent(axis, model, SELFCHECK_WINDOWS * window, seed=window)
    reference = full.run({axis.input: latent})[axis.output]
    channels = np.moveaxis(latent, axis.axis, -1).shape[1]
    first_window = np.ascontiguousarray(np.take(latent, np.arange(window), axis=axis.axis))
    feeds = _feeds(axis, first_window, options.tail_mask, window)

    exact = windowed_graph(model, axis, window, options.tail_mask)
    contexts = None if options.context is None else [options.context]
    mask = MASK_INPUT if options.tail_mask else None
    # The context is the decoder's reach: measured on the exact window graph, before any pass approximates it.
    search = windowing.measure_context(OnnxBackend(exact), latent, reference, window, hop, axis, gates.min_interior_db,
                                       contexts, mask)
    say(search.line())
    if options.context is None and search.context is None:
        raise SetupError(f"{model_path.name}: {search.line()}. The decoder reads further than a {window}-frame "
                         "window leaves room for: give a larger --window")
    context = options.context if options.context is not None else search.context
    if context not in search.worst_db:
        raise SetupError(f"--context {context}: a {window}-frame window keeps no interior window at that context "
                         f"(at most {(window - 1) // 2})")
    contract = windowing.contract_at(window, context, hop, axis, channels, mask)

    verdicts, graph, engine, bar = [], exact, None, WalkBar()
    if options.fix:
        graph, report = doctor.mend(exact, job.target, job.toolkit, feeds, say=say, skip=WINDOW_SKIPS)
        engine = doctor.engine_graph(graph, report)
        verdicts += doctor.pass_verdicts(report)
        bar = WalkBar.of(report)
    # the engine's fp32 graph is what the walk gates judge
    verdicts += walk_verdicts(OnnxBackend(graph), full, axis, model, latent, reference, contract, job, bar, say)
    verdicts.append(opscan.verdict(opscan.scan(engine or graph, job.target)))

    measured = MeasuredWindow(model_path.name, {str(c): json_safe(round(db, 2)) for c, db in search.worst_db.items()})
    fields = {**contract.to_fields(), **OutputRate(options.sample_rate).to_fields(), **measured.to_fields()}
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / f"{model_path.stem}_w{window}.onnx"
    contract_json = job.contract("main", **fields)
    onnx.save(set_contract(engine or graph, contract_json), str(onnx_path))
    twin = None
    if engine is not None:  # it relies on fp16 arithmetic: its exact fp32 graph is what it is judged against
        twin = reference_path(onnx_path)
        onnx.save(set_contract(graph, contract_json), str(twin))
    say(f"{model_path.name}: window {window}, context {context}, emitted {contract.emitted} frames x hop {hop}"
        + (", frame mask after every conv" if options.tail_mask else ""))
    return WindowExport(onnx_path, contract.emitted, verdicts, feeds, axis.shape(window, model),
                        axis.axis, twin)


def predicted_ms_per_emitted(job, written: WindowExport, scratch: Path) -> float | str:
    """The board-time model's ms per emitted frame of `written` built for the job's target, or why there is none (a
    failed build gate raises GateFailure)."""
    from rkaudio.engine.build import build_engine
    from rkaudio.pipeline.declaration import build_options
    from rkaudio.pipeline.pipeline import record_export

    record = record_export(written.onnx, written.verdicts, feeds=written.feeds, reference=written.reference)
    result = build_engine(record.onnx, scratch, build_options(job.gates, job.target, job.toolkit),
                          selfcheck=record.selfcheck, export_verdicts=record.verdicts, reference_onnx=record.reference)
    predicted = (result.manifest_data.get("predicted_board_ms") or {}).get("ms")
    return "no board-time constants for the target" if predicted is None else predicted / written.emitted


def choose_window(job, model_path: Path, say=print) -> int:
    """`--window auto`: each of AUTO_WINDOWS exported and built for the job's target; the one with the fewest
    predicted board ms per emitted frame among those whose export and build pass their gates."""
    import tempfile

    outcome: dict[int, float | str] = {}
    with tempfile.TemporaryDirectory(prefix="rkaudio-window-auto-") as scratch:
        for window in AUTO_WINDOWS:
            say(f"--window auto: window {window} for {job.target} ...")
            try:
                written = export_window(job, model_path, window, Path(scratch) / f"w{window}", say=say)
                failed = [v.name for v in written.verdicts if not v.passed]
                outcome[window] = (f"the export fails {', '.join(failed)}" if failed else
                                   predicted_ms_per_emitted(job, written, Path(scratch) / f"w{window}"))
            except GateFailure as failure:
                outcome[window] = "the build fails " + ", ".join(
                    f"{v.name} ({v.value:.4g} {v.unit}, threshold {v.threshold:.4g})" for v in failure.verdicts
                    if not v.passed)
            except (SetupError, BuildError) as error:
                outcome[window] = str(error).splitlines()[0]
    say(f"--window auto for {job.target}:")
    for window, result in outcome.items():
        say(f"  window {window}: " + (f"{result:.4f} predicted board ms per emitted frame"
                                      if isinstance(result, float) else result))
    priced = {window: ms for window, ms in outcome.items() if isinstance(ms, float)}
    if not priced:
        raise SetupError(f"--window auto: none of the windows {', '.join(map(str, AUTO_WINDOWS))} exports and builds "
                         f"for {job.target} with every gate passing (each one's reason is above)")
    best = min(priced, key=priced.get)
    say(f"--window auto: {best} for {job.target} ({priced[best]:.4f} ms per emitted frame predicted)")
    return best


def export(job, say=print) -> list:
    """The job's model at its window (`auto`: `choose_window`), written into `job.out` and gated; its one `Exported`
    record with the end-to-end golden beside it: a GOLDEN_WINDOWS-window latent walked over the engine."""
    from rkaudio.pipeline import pipeline

    model_path = source_model(job)
    window = job.options.window
    if window == "auto":
        window = choose_window(job, model_path, say)
    written = export_window(job, model_path, window, Path(job.out), say)
    record = pipeline.record_export(written.onnx, written.verdicts, feeds=written.feeds,
                                     reference=written.reference)
    frames = int(GOLDEN_WINDOWS * window)
    return pipeline.record_end_to_end(
        f"{written.onnx.stem}_walk", GOLDEN_LOOP, [record], {"latent": written.latent(frames, seed=frames)}, {},
        f"a {frames}-frame latent (white noise) walked over the {window}-frame engine: its first, interior and last "
        "windows, one engine call each")
