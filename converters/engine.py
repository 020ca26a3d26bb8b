"""Parent side of the engine build: run the converter-venv child, gate its log and simulator outputs,
write `<stem>.rknn`, `<stem>.manifest.json` and `<stem>.build.log`.

onnx / onnxruntime / numpy are imported inside functions so `convert --help` stays fast."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from converters.toolkit import (
    DEFAULT_TOOLKIT,
    REPO_ROOT,
    SetupError,
    check_target,
    check_toolkit,
    converter_python,
)
from gates.verdict import GateFailure, Verdict

# Newest ONNX IR version / default-domain opset each toolkit's bundled onnx can read
# (2.3.2 runs with onnx 1.16.1, 2.5.0 with onnx 1.18.0).
TOOLKIT_ONNX_LIMITS = {"2.3.2": {"ir": 10, "opset": 21}, "2.5.0": {"ir": 11, "opset": 23}}
CUSTOM_STRING_MAX_BYTES = 1024  # the toolkit's limit for config(custom_string=...)
LOG_TAIL_LINES = 20
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # the toolkit colours its log lines


@dataclass
class BuildOptions:
    target: str
    toolkit: str = DEFAULT_TOOLKIT
    max_regtask_lines: int = 100_000
    fail_on_cpu_ops: bool = False
    min_simulator_snr_db: float = 35.0
    timeout_s: float | None = None  # the child is killed with SIGKILL past this (reported like any signal)


@dataclass
class EngineResult:
    rknn: Path
    manifest: Path
    build_log: Path
    manifest_data: dict
    verdicts: list[Verdict]
    simulator_outputs: dict = field(default_factory=dict)


class BuildError(RuntimeError):
    """The converter child failed: killed by a signal, or the toolkit raised / returned an error."""

    def __init__(self, stage: str, reason: str, log_tail: list[str], log_path: Path | None = None):
        self.stage, self.reason, self.log_tail, self.log_path = stage, reason, log_tail, log_path
        where = f" (full log: {log_path})" if log_path else ""
        tail = "\n".join("    " + line for line in log_tail)
        super().__init__(f"engine build failed in stage '{stage}': {reason}{where}\n  last log lines:\n{tail}")


# ---------------------------------------------------------------- ONNX inspection

@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


def _tensor_specs(values, kind: str) -> list[TensorSpec]:
    from onnx import helper

    specs = []
    for value in values:
        tensor_type = value.type.tensor_type
        dims = []
        for axis, dim in enumerate(tensor_type.shape.dim):
            if not dim.HasField("dim_value") or dim.dim_value <= 0:
                label = dim.dim_param or "unknown"
                raise SetupError(
                    f"{kind} '{value.name}' has a symbolic dimension '{label}' at axis {axis}; the NPU needs "
                    "fixed shapes: export with fixed sizes (or pin them with surgery.fold.fold_fixed)")
            dims.append(int(dim.dim_value))
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
        specs.append(TensorSpec(value.name, tuple(dims), dtype))
    return specs


def graph_io(model) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Graph inputs (initializers excluded) and outputs with their fixed shapes."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    return _tensor_specs(inputs, "input"), _tensor_specs(model.graph.output, "output")


def toolkit_readable(model, toolkit: str):
    """The model with its IR version lowered to what the toolkit's onnx reads (when its opsets allow),
    or a SetupError saying which version is too new."""
    from onnx import helper

    limits = TOOLKIT_ONNX_LIMITS[toolkit]
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset > limits["opset"]:
        raise SetupError(f"the ONNX uses opset {opset}; rknn-toolkit2 {toolkit} reads opset <= {limits['opset']}: "
                         "export with a lower opset_version (rkaudio uses 17)")
    if model.ir_version <= limits["ir"]:
        return model
    needed = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if needed > limits["ir"]:
        raise SetupError(f"the ONNX needs IR version {needed}; rknn-toolkit2 {toolkit} reads IR <= {limits['ir']}")
    lowered = type(model)()
    lowered.CopyFrom(model)
    lowered.ir_version = limits["ir"]
    return lowered


def custom_string(contract: dict) -> str:
    """Compact JSON of the contract essentials, embedded in the engine (at most 1024 bytes):
    keys are added in priority order while they fit."""
    producer = contract.get("producer", {})
    candidates = [
        ("family", contract.get("family")), ("component", contract.get("component")),
        ("role", contract.get("role")), ("exec_plan_option", contract.get("exec_plan_option")),
        ("rkaudio", producer.get("rkaudio")), ("git", producer.get("git")),
        ("ladder_key", contract.get("ladder_key")), ("exec_params", contract.get("exec_params")),
    ]
    essentials: dict = {}
    for key, value in candidates:
        if value is None:
            continue
        trial = {**essentials, key: value}
        if len(json.dumps(trial, separators=(",", ":")).encode()) <= CUSTOM_STRING_MAX_BYTES:
            essentials = trial
    return json.dumps(essentials, separators=(",", ":"))


# ---------------------------------------------------------------- the child

def _log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    text = ANSI_ESCAPE.sub("", text)
    return [line for line in text.splitlines() if line.strip()][-lines:]


def kill_stray_adb(venv_dir: Path) -> list[int]:
    """SIGKILL every `adb` process whose executable lives inside `venv_dir` (the toolkit bundles one whose
    server outlives Python; the child never starts it, this is the safety net). Returns the pids killed."""
    venv_dir = venv_dir.resolve()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = Path(os.readlink(entry / "exe"))
        except OSError:
            continue
        if exe.name.startswith("adb") and venv_dir in exe.parents:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except OSError:
                pass
    return killed


class ConverterChild:
    """One `python -m converters.build_engine` child in the converter venv: builds the ONNX once, then runs
    simulator requests until closed. Its fds 1/2 go to `log_path`; JSON events come back on a pipe.
    Used by `build_engine` (export + one self-check run) and `runtime.backends.SimulatorBackend` (serve)."""

    def __init__(self, onnx_path: Path, target: str, toolkit: str, log_path: Path | None, *,
                 rknn_path: Path | None, simulate: bool, timeout_s: float | None = None):
        import onnx

        self.target = check_target(target)
        self.toolkit = check_toolkit(toolkit)
        python = converter_python(self.toolkit)
        self._venv_dir = python.parent.parent
        self.work_dir = Path(tempfile.mkdtemp(prefix="rkaudio-child-"))
        # Without a log_path the log lives (and dies) with the work dir; errors still quote its tail.
        self._log_kept = log_path is not None
        self.log_path = Path(log_path) if self._log_kept else self.work_dir / "build.log"
        self.stage = "start"
        self._proc = None
        try:
            model = onnx.load(str(onnx_path))
            self.inputs, self.outputs = graph_io(model)
            readable = toolkit_readable(model, self.toolkit)
            if readable is not model:
                onnx_path = self.work_dir / "model.onnx"
                onnx.save(readable, str(onnx_path))
            request = {
                "onnx": str(Path(onnx_path).resolve()), "target": self.target,
                "inputs": [s.name for s in self.inputs], "input_shapes": [list(s.shape) for s in self.inputs],
                "outputs": [s.name for s in self.outputs],
                "custom_string": custom_string(_contract_of(model)),
                "rknn": str(rknn_path) if rknn_path else None, "simulate": simulate,
            }
            self._start(python, request, timeout_s)
        except BaseException:
            self._cleanup()
            raise

    def _start(self, python: Path, request: dict, timeout_s: float | None) -> None:
        read_fd, write_fd = os.pipe()
        request["events_fd"] = write_fd
        request_path = self.work_dir / "request.json"
        request_path.write_text(json.dumps(request))
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(self.work_dir),
               "PYTHONUNBUFFERED": "1"}
        for key in ("VIRTUAL_ENV", "PYTHONHOME"):
            env.pop(key, None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [str(python), "-m", "converters.build_engine", str(request_path)],
                cwd=self.work_dir, stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write_fd,), env=env)
        os.close(write_fd)
        self._events = os.fdopen(read_fd, "r")
        self._timer, self._timeout_s, self._timed_out = None, timeout_s, False
        if timeout_s is not None:
            self._timer = threading.Timer(timeout_s, self._on_timeout)
            self._timer.daemon = True
            self._timer.start()

    def _on_timeout(self) -> None:
        self._timed_out = True
        self._proc.kill()

    def _next_event(self, wanted: str) -> dict:
        """Read events until one carrying `wanted`; a child error or death becomes a BuildError."""
        for line in self._events:
            event = json.loads(line)
            if "stage" in event:
                self.stage = event["stage"]
            if "error" in event:
                self._fail(event["error"])
            if wanted in event:
                return event
        self._fail(None)

    def _close_stdin(self) -> None:
        """End of run requests: the child releases the toolkit and exits (a dead child's pipe may be broken)."""
        if self._proc is not None and self._proc.stdin and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def _fail(self, error: str | None):
        self._close_stdin()
        code = self._proc.wait()
        self._reap()
        if code < 0:
            reason = f"killed by signal {signal.Signals(-code).name}"
            if self._timed_out:
                reason += f" (timeout: {self._timeout_s:g} s)"
        elif error:
            reason = error
        else:
            reason = f"exited with code {code} without reporting an error"
        stage = self.stage
        tail = _log_tail(self.log_path)
        self._cleanup()
        raise BuildError(stage, reason, tail, self.log_path if self._log_kept else None)

    def wait_ready(self) -> None:
        self._next_event("ready")

    def run(self, feeds: dict) -> dict:
        """Simulator outputs for `feeds` (input name -> array), by output name."""
        import numpy as np

        inputs_path = self.work_dir / "run_inputs.npz"
        outputs_path = self.work_dir / "run_outputs.npz"
        np.savez(inputs_path, **feeds)
        try:
            self._proc.stdin.write((json.dumps({"inputs": str(inputs_path), "outputs": str(outputs_path)}) + "\n").encode())
            self._proc.stdin.flush()
        except BrokenPipeError:  # the child is already gone: report how it died
            self._fail(None)
        self._next_event("ran")
        with np.load(outputs_path) as data:
            outputs = {name: data[name] for name in data.files}
        # The toolkit may return a 4-D view of a lower-rank output: restore the ONNX shape.
        shapes = {s.name: s.shape for s in self.outputs}
        return {name: value.reshape(shapes[name]) if value.size == int(np.prod(shapes[name])) else value
                for name, value in outputs.items()}

    def close(self) -> None:
        """Let the child release the toolkit and exit; a failure on the way out is still reported."""
        if self._proc is None:
            self._cleanup()
            return
        self._close_stdin()
        self._next_event("done")
        self._proc.wait()
        self._reap()
        self._cleanup()

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._reap()
        self._cleanup()

    def _reap(self) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()
        kill_stray_adb(self._venv_dir)

    def _cleanup(self) -> None:
        events = getattr(self, "_events", None)
        if events is not None and not events.closed:
            events.close()
        self._close_stdin()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            self.close()
        else:
            self.kill()


def _contract_of(model) -> dict:
    from surgery.metadata import get_contract

    return get_contract(model)


# ---------------------------------------------------------------- build_engine

def _reference_outputs(onnx_path: Path, feeds: dict) -> dict:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


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

    from gates import fp16_range, layer_table, manifest, regtask
    from surgery.metadata import get_contract

    check_target(options.target)
    check_toolkit(options.toolkit)
    onnx_path, out_dir = Path(onnx_path), Path(out_dir)
    if not onnx_path.is_file():
        raise SetupError(f"no ONNX at {onnx_path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = onnx_path.stem
    final_rknn, final_manifest = out_dir / f"{stem}.rknn", out_dir / f"{stem}.manifest.json"
    log_path = out_dir / f"{stem}.build.log"
    partial_rknn = out_dir / f".{stem}.rknn.partial"
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
            raise BuildError("export", "the child finished but wrote no engine", _log_tail(log_path), log_path)

        log_text = log_path.read_text(errors="replace")
        regtask_report = regtask.parse_regtask(log_text)
        try:
            table = layer_table.parse_layer_table(log_text)
        except ValueError as error:
            raise BuildError("parse log", str(error), _log_tail(log_path), log_path) from None
        verdicts = [*export_verdicts, constants, regtask.regtask_verdict(regtask_report, options.max_regtask_lines)]
        advice = {verdicts[-1].name: regtask.ADVICE}
        if options.fail_on_cpu_ops:
            verdicts.append(layer_table.cpu_ops_verdict(table))
            advice[verdicts[-1].name] = layer_table.ADVICE
        simulator_figures = {}
        if feeds is not None:
            reference = _reference_outputs(Path(reference_onnx or onnx_path), feeds)
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


def random_feeds(inputs: list[TensorSpec], seed: int = 0) -> dict:
    """Deterministic self-check feeds: standard normal for float inputs, zeros for the others."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {spec.name: rng.standard_normal(spec.shape).astype(spec.dtype) if np.dtype(spec.dtype).kind == "f"
            else np.zeros(spec.shape, dtype=spec.dtype) for spec in inputs}
