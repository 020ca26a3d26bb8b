"""The engine build: gate the ONNX, compile it in the converter-venv child (`toolkit.session`), gate the
child's log and its simulator outputs, write `<stem>.rknn`, `<stem>.manifest.json` and `<stem>.build.log`.
A failing gate leaves no .rknn and no manifest (the log stays).

onnx / numpy are imported inside functions so `convert --help` stays fast."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from core.errors import BuildError, GateFailure, SetupError
from core.paths import build_log_name, engine_name, manifest_name
from gates.verdict import Verdict
from toolkit.session import ConverterChild, log_tail
from toolkit.versions import DEFAULT_TOOLKIT, check_target, check_toolkit


@dataclass
class BuildOptions:
    target: str
    toolkit: str = DEFAULT_TOOLKIT
    max_regtask_lines: int = 100_000
    fail_on_cpu_ops: bool = False
    min_simulator_snr_db: float = 35.0
    timeout_s: float | None = None  # the child is killed with SIGKILL past this (reported like any signal)

    @classmethod
    def from_recipe(cls, recipe: dict, target: str, toolkit: str) -> "BuildOptions":
        """A recipe's options: its `[gates]` keys that name BuildOptions fields override the defaults
        (the other `[gates]` keys are the family's own thresholds)."""
        names = {f.name for f in fields(cls)} - {"target", "toolkit"}
        return cls(target=target, toolkit=toolkit, **{k: v for k, v in recipe["gates"].items() if k in names})


@dataclass
class EngineResult:
    rknn: Path
    manifest: Path
    build_log: Path
    manifest_data: dict
    verdicts: list[Verdict]
    simulator_outputs: dict = field(default_factory=dict)


def simulator_verdicts(reference: dict, simulated: dict, min_snr_db: float) -> tuple[list[Verdict], dict]:
    """Per output: SNR of the simulator against onnxruntime fp32 (gated) and max|d| (recorded)."""
    from gates.snr import max_abs, snr_db

    verdicts, figures = [], {}
    for name, ref in reference.items():
        snr, worst = snr_db(ref, simulated[name]), max_abs(ref, simulated[name])
        figures[name] = {"snr_db": snr, "max_abs": worst}
        verdicts.append(Verdict(f"simulator_snr[{name}]", snr, min_snr_db, "dB", bool(snr >= min_snr_db),
                                f"max|d| {worst:.3g} vs onnxruntime fp32"))
    return verdicts, figures


SIMULATOR_ADVICE = ("the fp16 simulator disagrees with onnxruntime fp32: look for fp16 overflow (inf) or "
                    "precision loss (large constants, long reductions) in the graph, or lower the threshold "
                    "(min_simulator_snr_db, --min-snr) if the family's own gate accepts it")


def build_engine(onnx_path, out_dir, options: BuildOptions, selfcheck=None, export_verdicts=(),
                 reference_onnx=None) -> EngineResult:
    """Compile `onnx_path` for `options.target` in the converter child, gate it, write the artifacts.
    `reference_onnx`: the fp32 graph the simulator is compared with, when the engine graph relies on fp16
    arithmetic (e.g. a native fp16 rounding) and so cannot be its own fp32 reference; default `onnx_path`."""
    import numpy as np
    import onnx

    from core.contract import get_contract
    from gates import fp16_range, layer_table, manifest, regtask
    from runtime.backends import OnnxBackend

    check_target(options.target)
    check_toolkit(options.toolkit)
    onnx_path, out_dir = Path(onnx_path), Path(out_dir)
    if not onnx_path.is_file():
        raise SetupError(f"no ONNX at {onnx_path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = onnx_path.stem
    final_rknn, final_manifest = out_dir / engine_name(onnx_path), out_dir / manifest_name(onnx_path)
    log_path = out_dir / build_log_name(onnx_path)
    partial_rknn = out_dir / f".{final_rknn.name}.partial"
    for stale in (final_rknn, final_manifest, partial_rknn):
        stale.unlink(missing_ok=True)

    constants = fp16_range.fp16_constants_verdict(onnx.load(str(onnx_path)))
    if not constants.passed:  # fail before a compile that can take minutes
        raise GateFailure([constants], advice=fp16_range.ADVICE, context=f"{stem} for {options.target}")

    feeds = None
    if selfcheck is not None:
        with np.load(selfcheck) as data:
            feeds = {name: data[name] for name in data.files}
    try:
        child = ConverterChild(onnx_path, options.target, options.toolkit, log_path, rknn_path=partial_rknn,
                               simulate=feeds is not None, timeout_s=options.timeout_s)
        with child:
            child.wait_ready()
            if feeds is not None:
                missing = [s.name for s in child.inputs if s.name not in feeds]
                if missing:
                    raise SetupError(f"self-check {selfcheck} lacks inputs {missing} (keys must be the ONNX input names)")
                wrong = [f"{s.name} {feeds[s.name].shape} (ONNX {s.shape})" for s in child.inputs
                         if feeds[s.name].shape != s.shape]
                if wrong:
                    raise SetupError(f"self-check {selfcheck} has inputs of the wrong shape: {', '.join(wrong)}")
                feeds = {s.name: np.asarray(feeds[s.name], dtype=s.dtype) for s in child.inputs}
                simulated = child.run(feeds)
            inputs, outputs = child.inputs, child.outputs
        if not partial_rknn.is_file():
            raise BuildError("export", "the child finished but wrote no engine", log_tail(log_path), log_path)

        log_text = log_path.read_text(errors="replace")
        regtask_report = regtask.parse_regtask(log_text)
        try:
            table = layer_table.parse_layer_table(log_text)
        except ValueError as error:
            raise BuildError("parse log", str(error), log_tail(log_path), log_path) from None
        verdicts = [*export_verdicts, constants, regtask.regtask_verdict(regtask_report, options.max_regtask_lines)]
        advice = {verdicts[-1].name: regtask.ADVICE}
        if options.fail_on_cpu_ops:
            verdicts.append(layer_table.cpu_ops_verdict(table))
            advice[verdicts[-1].name] = layer_table.ADVICE
        simulator_figures = {}
        if feeds is not None:
            with OnnxBackend(Path(reference_onnx or onnx_path)) as reference_graph:
                reference = reference_graph.run(feeds)
            sim_verdicts, simulator_figures = simulator_verdicts(reference, simulated, options.min_simulator_snr_db)
            verdicts += sim_verdicts
            advice.update({v.name: SIMULATOR_ADVICE for v in sim_verdicts})
        failed = [v for v in verdicts if not v.passed]
        if failed:
            hints = list(dict.fromkeys(advice[v.name] for v in failed if v.name in advice))
            raise GateFailure(failed, advice="; ".join(hints), context=f"{stem} for {options.target}")

        os.replace(partial_rknn, final_rknn)
        data = manifest.build_manifest(
            contract=get_contract(onnx.load(str(onnx_path), load_external_data=False)),
            target=options.target, toolkit=options.toolkit, inputs=inputs, outputs=outputs,
            onnx_path=onnx_path, rknn_path=final_rknn, build_log=log_path, regtask_report=regtask_report,
            table=table, verdicts=verdicts, simulator=simulator_figures)
        manifest.write_manifest(final_manifest, data)
    except BaseException:
        partial_rknn.unlink(missing_ok=True)
        final_rknn.unlink(missing_ok=True)
        final_manifest.unlink(missing_ok=True)
        raise
    return EngineResult(final_rknn, final_manifest, log_path, data, verdicts,
                        simulated if feeds is not None else {})
