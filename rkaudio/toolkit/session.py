"""The parent half of the converter-venv child (`rkaudio.toolkit.child`): inspect the ONNX the toolkit will read,
start the child in its own temporary directory with fds 1/2 on a log, follow its stage events, send it
simulator runs, and reap it (and any adb server the toolkit started). The engine build
(`rkaudio.engine.build.build_engine`) and the simulator backend (`rkaudio.host.backends.SimulatorBackend`) share it.

onnx / numpy are imported inside functions so the CLI's `--help` stays fast."""
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
from dataclasses import dataclass
from pathlib import Path

from rkaudio.board.contract import EngineContract
from rkaudio.core.contract import contract_of
from rkaudio.core.errors import BuildError, SetupError
from rkaudio.core.paths import REPO_ROOT
from rkaudio.board.shapes import matching_set, output_shapes, shape_sets
from rkaudio.board.soc import Target
from rkaudio.toolkit.versions import Toolkit, converter_python

# Newest ONNX IR version / default-domain opset each toolkit's bundled onnx can read
# (2.3.2 runs with onnx 1.16.1, 2.5.0 with onnx 1.18.0).
TOOLKIT_ONNX_LIMITS = {"2.3.2": {"ir": 10, "opset": 21}, "2.5.0": {"ir": 11, "opset": 23}}
# Toolkit rules a dynamic-shape build (an engine of several shape sets) turns off. 2.3.2's
# replace_parallel_slice_by_split joins Slices of one tensor that cover it ([0:-2] and [-2:] of the tiny Qwen3 step's
# pre_conv halo join, the ends counted from the axis end as rkaudio.surgery.graph.shape_generic writes them) into a Split
# whose sizes it takes from the negative bounds, and refuses the graph: "The shape [1, -2, 16] of
# '/step/pre_conv/Slice_1_output_0' for Split(...) is invalid! The model can not be dynamic!". Off, the first/main
# ladder builds with every gate held and per-set est_cycles within 2% of the static engines' (rk3588, measured
# 2026-12-03). 2.5.0 builds it with the rule on. A fixed-shape build keeps every rule.
DYNAMIC_DISABLED_RULES = {"2.3.2": ("replace_parallel_slice_by_split",), "2.5.0": ()}
# Toolkits whose dynamic-shape build runs a last-axis ReduceMean on the CPU, where their fixed-shape build makes it
# a 1x1 Conv: a dynamic ladder writes those means as MatMuls for them (rkaudio.surgery.graph.mean_as_matmul). 2.3.2: the
# tiny Qwen3 step's 5 RMSNorm means on the CPU in each shape set, est_cycles 2.0% / 2.1% under the static engines';
# as MatMuls 1.4% / 1.5%, simulator SNR as static. 2.5.0 keeps them on the NPU (the MatMul there: +0.7% est_cycles,
# +3% predicted board ms; rk3588, measured 2026-12-03). A LayerNorm's means stay: 2.3.2 fuses them into exNorm at
# dynamic shapes too.
DYNAMIC_MEANS_ON_CPU = ("2.3.2",)
CUSTOM_STRING_MAX_BYTES = 1024  # the toolkit's limit for config(custom_string=...)
LOG_TAIL_LINES = 20
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # the toolkit colours its log lines

# ---------------------------------------------------------------- ONNX inspection

@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


def _tensor_specs(values, kind: str, fixed: dict | None = None) -> list[TensorSpec]:
    from onnx import helper

    specs = []
    for value in values:
        tensor_type = value.type.tensor_type
        dims = []
        for axis, dim in enumerate(tensor_type.shape.dim):
            if fixed and value.name in fixed:
                dims.append(int(fixed[value.name][axis]))
                continue
            if not dim.HasField("dim_value") or dim.dim_value <= 0:
                label = dim.dim_param or "unknown"
                raise SetupError(
                    f"{kind} '{value.name}' has a symbolic dimension '{label}' at axis {axis}; the NPU needs "
                    "fixed shapes: pin it, `convert build MODEL.onnx --shape NAME=DIMS` (e.g. --shape mel=1,100,80), or "
                    "list the shape sets in the contract's `shape_sets` (a family's `--ladder dynamic` does)")
            dims.append(int(dim.dim_value))
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
        specs.append(TensorSpec(value.name, tuple(dims), dtype))
    return specs


def graph_io(model, shape_set: dict | None = None) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Graph inputs (initializers excluded) and outputs with their fixed shapes; for an engine of several shape
    sets, those of `shape_set` (an entry of the contract's `shape_sets`; default: the last, the largest rung)."""
    chosen = _shape_set(model, shape_set)
    return input_specs(model, shape_set), _tensor_specs(model.graph.output, "output", chosen["outputs"])


def input_specs(model, shape_set: dict | None = None) -> list[TensorSpec]:
    """The graph inputs of `graph_io` alone: a graph with its inputs pinned and its output shapes not yet inferred
    (a user's ONNX before its fold) has them."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    return _tensor_specs(inputs, "input", _shape_set(model, shape_set)["inputs"])


def _shape_set(model, shape_set: dict | None) -> dict:
    sets = shape_sets(contract_of(model))
    return shape_set or (sets[-1] if sets else {"inputs": {}, "outputs": {}})


def dynamic_input(model, inputs: list[TensorSpec]) -> list | None:
    """`config(dynamic_input=...)` of an engine of several shape sets (each set's input shapes in `inputs` order),
    None for a fixed-shape one."""
    sets = shape_sets(contract_of(model))
    if not sets:
        return None
    return [[list(entry["inputs"][spec.name]) for spec in inputs] for entry in sets]


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


def custom_string(contract: EngineContract) -> str:
    """Compact JSON of the contract essentials, embedded in the engine (at most 1024 bytes):
    keys are added in priority order while they fit. Its bytes are the engine's: the order and the values (nested
    dicts in the order the contract was loaded) must not change, or every engine's `normalized_sha256` does."""
    producer = contract.producer or {}
    candidates = [
        ("family", contract.family), ("component", contract.component),
        ("role", contract.role), ("exec_plan_option", contract.exec_plan_option),
        ("rkaudio", producer.get("rkaudio")), ("git", producer.get("git")),
        ("ladder_key", contract.ladder_key), ("exec_params", contract.exec_params),
        # an engine of several shape sets: each set's inputs that vary, so a board can ask the engine itself
        ("shape_sets", _varying_inputs(contract.shape_sets)),
    ]
    essentials: dict = {}
    for key, value in candidates:
        if value is None:
            continue
        trial = {**essentials, key: value}
        if len(json.dumps(trial, separators=(",", ":")).encode()) <= CUSTOM_STRING_MAX_BYTES:
            essentials = trial
    return json.dumps(essentials, separators=(",", ":"))


def _varying_inputs(sets: list | None) -> dict | None:
    """The shape sets in brief (the manifest holds them in full): the first input whose shape differs between
    sets, and per set its role and that input's shape: what a board runtime feeds to pick a set."""
    if not sets:
        return None
    varying = next(name for name in sets[0]["inputs"] if len({tuple(s["inputs"][name]) for s in sets}) > 1)
    return {"by": varying, "sets": [[EngineContract.from_json(s["contract"]).role, s["inputs"][varying]] for s in sets]}


# ---------------------------------------------------------------- the child

def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
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


MALLOC_PERTURB = "85"  # any fixed non-zero byte; see ConverterChild._start
CHILD_DIR_PREFIX = "rkaudio-child-"  # + the parent's pid: a directory whose parent is gone is stale


def remove_stale_work_dirs() -> list[Path]:
    """Remove the child work directories of parents that no longer run (a SIGKILLed run leaves its own)."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{CHILD_DIR_PREFIX}*-*"):
        owner = path.name[len(CHILD_DIR_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def release_freed_heap() -> None:
    """Hand the memory this process has freed back to the system before a compile starts: glibc keeps freed heap
    (the export's, the host references') mapped, and the child of a real-shape compile needs 10 GB beside us."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # a libc without malloc_trim holds nothing we can return
        pass


class ConverterChild:
    """One `python -m rkaudio.toolkit.child` child in the converter venv: builds the ONNX once, then runs
    simulator requests until closed. Its fds 1/2 go to `log_path`; JSON events come back on a pipe.
    Used by `build_engine` (export + one self-check run) and `rkaudio.host.backends.SimulatorBackend` (serve)."""

    def __init__(self, onnx_path: Path, target: Target, toolkit: Toolkit, log_path: Path | None, *,
                 rknn_path: Path | None, simulate: bool, timeout_s: float | None = None):
        import onnx

        self.target, self.toolkit = target, toolkit
        python = converter_python(self.toolkit)
        self._venv_dir = python.parent.parent
        remove_stale_work_dirs()
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"{CHILD_DIR_PREFIX}{os.getpid()}-"))
        # Without a log_path the log lives (and dies) with the work dir; errors still quote its tail.
        self._log_kept = log_path is not None
        self.log_path = Path(log_path) if self._log_kept else self.work_dir / "build.log"
        self.stage = "start"
        self._proc = None
        self.peak_rss_bytes = None  # the child's peak resident memory, known once it closed cleanly
        self.stage_peak_rss_bytes = {}  # and each stage's (import, config, load, build, export, init_runtime, ...)
        try:
            model = onnx.load(str(onnx_path))
            contract = contract_of(model)
            self.inputs, self.outputs = graph_io(model)
            self.shape_sets = shape_sets(contract)
            readable = toolkit_readable(model, self.toolkit)
            if readable is not model:
                onnx_path = self.work_dir / "model.onnx"
                onnx.save(readable, str(onnx_path))
            request = {
                "onnx": str(Path(onnx_path).resolve()), "target": self.target,
                "inputs": [s.name for s in self.inputs], "input_shapes": [list(s.shape) for s in self.inputs],
                "outputs": [s.name for s in self.outputs],
                "custom_string": custom_string(contract),
                "dynamic_input": dynamic_input(model, self.inputs),
                "disable_rules": list(DYNAMIC_DISABLED_RULES[self.toolkit]) if self.shape_sets else [],
                # Absolute: the child runs in its own work dir, where a relative --out would point nowhere.
                "rknn": str(Path(rknn_path).resolve()) if rknn_path else None, "simulate": simulate,
                "parent_pid": os.getpid(),
            }
            del model, readable
            release_freed_heap()
            self._start(python, request, timeout_s)
        except BaseException:
            self._cleanup()
            raise

    def _start(self, python: Path, request: dict, timeout_s: float | None) -> None:
        read_fd, write_fd = os.pipe()
        request["events_fd"] = write_fd
        request_path = self.work_dir / "request.json"
        request_path.write_text(json.dumps(request))
        # MALLOC_PERTURB_: the compiler writes some never-initialised heap bytes into the engine (about 2 KB
        # that differ between builds of one ONNX); glibc filling every allocation with a fixed byte makes two
        # builds of the same graph byte-identical (measured on the example and the Piper decoder engines).
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(self.work_dir),
               "PYTHONUNBUFFERED": "1", "MALLOC_PERTURB_": MALLOC_PERTURB}
        for key in ("VIRTUAL_ENV", "PYTHONHOME"):
            env.pop(key, None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [str(python), "-m", "rkaudio.toolkit.child", str(request_path)],
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
        tail = log_tail(self.log_path)
        self._cleanup()
        raise BuildError(stage, reason, tail, self.log_path if self._log_kept else None)

    def wait_ready(self) -> None:
        self._next_event("ready")

    def run(self, feeds: dict) -> dict:
        """Simulator outputs for `feeds` (input name -> array), by output name."""
        import numpy as np

        shapes = {s.name: s.shape for s in self.outputs}
        if self.shape_sets:  # refused before the toolkit sees a shape the engine was not compiled for
            fed = {name: np.shape(value) for name, value in feeds.items()}
            shapes = output_shapes(self.shape_sets, matching_set(self.shape_sets, fed, "the simulator"))
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
        # The toolkit may return a 4-D view of a lower-rank output: restore the ONNX shape (the fed set's).
        return {name: value.reshape(shapes[name]) if value.size == int(np.prod(shapes[name])) else value
                for name, value in outputs.items()}

    def analyse(self, feeds: dict) -> dict:
        """rknn-toolkit2's accuracy_analysis of the built engine on `feeds` (simulator, no device): a dict with
        `error_analysis` (the toolkit's error_analysis.txt) and `layers` (per IR layer, in graph order: name,
        file, shape, size, signal = sum(golden^2), noise = sum((golden - simulator)^2), finite). The golden is
        the toolkit's own fp32 run of the engine graph. The tensor dumps live in the child's work dir only
        while it reduces them."""
        import numpy as np

        job_dir = self.work_dir / "analysis"
        inputs_path, summary_path = self.work_dir / "analyse_inputs.npz", self.work_dir / "analysis.json"
        np.savez(inputs_path, **feeds)
        request = {"analyse": {"inputs": str(inputs_path), "dir": str(job_dir), "summary": str(summary_path)}}
        try:
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
        except BrokenPipeError:
            self._fail(None)
        self._next_event("analysed")
        try:
            return json.loads(summary_path.read_text())
        finally:
            summary_path.unlink(missing_ok=True)
            inputs_path.unlink(missing_ok=True)
            shutil.rmtree(job_dir, ignore_errors=True)

    def close(self) -> None:
        """Let the child release the toolkit and exit; a failure on the way out is still reported."""
        events = getattr(self, "_events", None)
        if self._proc is None or events is None or events.closed:  # never started, or failed and reaped already
            self._cleanup()
            return
        self._close_stdin()
        done = self._next_event("done")
        self.peak_rss_bytes = int(done.get("peak_rss_kb", 0)) * 1024
        self.stage_peak_rss_bytes = {stage: int(kb) * 1024 for stage, kb in done.get("stage_peak_rss_kb", {}).items()}
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


def random_feeds(inputs: list[TensorSpec], seed: int = 0) -> dict:
    """Deterministic self-check feeds: standard normal for float inputs, zeros for the others."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {spec.name: rng.standard_normal(spec.shape).astype(spec.dtype) if np.dtype(spec.dtype).kind == "f"
            else np.zeros(spec.shape, dtype=spec.dtype) for spec in inputs}
