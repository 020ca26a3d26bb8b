"""Child process that compiles one fixed-shape ONNX with rknn-toolkit2 (runs in a converter venv).

Usage: `python -m rkaudio.toolkit.child REQUEST.json`, cwd = a fresh temporary directory (verbose mode
writes check*.onnx there), fds 1 and 2 = the build log (the native compiler writes to them directly).
Imports only the stdlib, numpy, onnxruntime and rknn: the converter venv holds nothing else of rkaudio's
world.

Request keys: onnx, target, inputs (names), input_shapes, custom_string, dynamic_input (null, or the input
shapes of each shape set an engine of several is compiled for), disable_rules (toolkit rules config() turns
off: `rkaudio.toolkit.session.DYNAMIC_DISABLED_RULES`), rknn (path to export to, or null), outputs (names), simulate (bool: start the simulator), events_fd (a pipe write end inherited
from the parent), parent_pid (the child dies with it).
Every step is announced on the events pipe as one JSON line ({"stage": ...}) *before* it starts, so the
parent can name the stage in which a signal killed the child. After the build, the child answers run
requests read from stdin, one JSON line each ({"inputs": npz, "outputs": npz}), until stdin closes:
the simulator only runs the engine built in this process (it refuses engines loaded from disk).
A line {"analyse": {"inputs": npz, "dir": scratch dir, "summary": json}} runs the toolkit's
accuracy_analysis (simulator, target=None) on those inputs instead, writes per-layer energies (signal and
golden-vs-simulator noise, from its dumps) and error_analysis.txt into the summary JSON, and deletes the dumps."""
from __future__ import annotations

import json
import os
import sys
import traceback


class ToolkitError(RuntimeError):
    """The toolkit returned a non-zero code (it mixes exceptions and -1 returns)."""


def _checked(stage: str, code) -> None:
    if code is not None and code != 0:
        raise ToolkitError(f"rknn {stage} returned {code}")


class _Events:
    """The events pipe; it also keeps the resident peak of every stage (`stage_peaks`, kB), each measured from
    the stage's announcement to the next one's (the high-water mark is reset at each)."""

    def __init__(self, fd: int):
        self._stream = os.fdopen(fd, "w", buffering=1)
        self.stage_peaks: dict = {}
        self._stage = None

    def end_stage(self) -> None:
        """Book the peak of the stage that is ending (a repeated stage keeps its largest peak), then reset it."""
        if self._stage is not None:
            self.stage_peaks[self._stage] = max(self.stage_peaks.get(self._stage, 0), own_peak_rss_kb())
            self._stage = None
        reset_peak_rss()

    def send(self, **event) -> None:
        if "stage" in event or "done" in event or "ready" in event:
            self.end_stage()
            self._stage = event.get("stage")
        self._stream.write(json.dumps(event) + "\n")
        self._stream.flush()
        # Mirror into the log so a reader of the build log sees where each stage starts.
        print(f"[rkaudio] {json.dumps(event)}", file=sys.stderr, flush=True)


def _sessions_without_arena() -> None:
    """Every onnxruntime session created from here on allocates without a memory arena.

    Why: the toolkit's simulator runs the engine one layer at a time, an onnxruntime session per layer, and keeps
    every session to the end. Each session's CPU arena grows to its layer's largest buffers and never shrinks, so
    the simulator held the largest tensors of all 1,287 layers of the real-shape Qwen3 B=64 step at once. The
    simulator itself drops each layer's output after its last reader; without arenas that memory goes back: that
    step's simulate peak fell from 18.9 GB to 8.4 GB (rk3588, toolkit 2.3.2, measured 2026-12-02). Allocation
    only: the outputs are bit-identical."""
    import onnxruntime

    created = onnxruntime.InferenceSession.__init__

    def init(session, path_or_bytes, sess_options=None, *args, **kwargs):
        sess_options = sess_options or onnxruntime.SessionOptions()
        sess_options.enable_cpu_mem_arena = False
        created(session, path_or_bytes, sess_options, *args, **kwargs)

    onnxruntime.InferenceSession.__init__ = init


def _simulate(rknn, request: dict, run: dict) -> None:
    import numpy as np

    feeds = np.load(run["inputs"])
    missing = [name for name in request["inputs"] if name not in feeds.files]
    if missing:
        raise ToolkitError(f"self-check inputs lack {missing}; they hold {feeds.files}")
    arrays = [np.ascontiguousarray(feeds[name]) for name in request["inputs"]]
    # 'nchw' everywhere: the arrays are in the ONNX layout (the default 'nhwc' would transpose 4-D inputs).
    outputs = rknn.inference(inputs=arrays, data_format=["nchw"] * len(arrays))
    if outputs is None:
        raise ToolkitError("rknn inference returned None")
    names = request["outputs"]
    np.savez(run["outputs"], **{name: np.asarray(value) for name, value in zip(names, outputs)})


def _energies(golden, simulated) -> dict:
    """sum(golden^2) and sum((golden - simulated)^2) in float64 (None when the simulator is non-finite)."""
    import numpy as np

    golden = np.asarray(golden, dtype=np.float64)
    simulated = np.asarray(simulated, dtype=np.float64)
    entry = {"shape": list(golden.shape), "size": int(golden.size), "signal": float(np.sum(golden**2)),
             "finite": bool(np.all(np.isfinite(simulated)))}
    if golden.size != simulated.size:
        entry["missing"] = f"simulator dump has {simulated.size} values, golden {golden.size}"
    else:
        entry["noise"] = float(np.sum((golden.ravel() - simulated.ravel()) ** 2)) if entry["finite"] else None
    return entry


def _analyse(rknn, request: dict, job: dict) -> None:
    """accuracy_analysis on the simulator, reduced to what a per-layer table needs. The toolkit dumps every
    layer twice as .npy (golden, then simulator, layer by layer; gigabytes on a large graph) and as text (its
    C++ `cpputils2.savetxt`): the dumps are caught as they are saved (numpy.save and both savetxt stubbed for
    the call; the toolkit computes its own table in memory and never reads them back), reduced to energies
    pair by pair, and never written.
    A dump that reaches the disk anyway (another writer) is read back and deleted with the snapshot."""
    import shutil

    import numpy as np

    feeds = np.load(job["inputs"])
    os.makedirs(job["dir"], exist_ok=True)
    paths = []
    for position, name in enumerate(request["inputs"]):
        paths.append(os.path.join(job["dir"], f"input{position}.npy"))
        np.save(paths[-1], np.ascontiguousarray(feeds[name]))
    snapshot = os.path.join(job["dir"], "snapshot")
    pending, energies = {}, {}

    def caught_save(file, arr, *args, **kwargs):
        parts = os.path.normpath(str(file)).split(os.sep)
        if len(parts) >= 3 and parts[-2] == "npy" and parts[-3] in ("golden", "simulator"):
            stem = os.path.splitext(parts[-1])[0]
            if parts[-3] == "golden":
                pending[stem] = np.array(arr, copy=True)
            elif stem in pending:
                energies[stem] = _energies(pending.pop(stem), arr)
            return None
        return save(file, arr, *args, **kwargs)

    def no_text(*args, **kwargs):
        return None

    save, savetxt = np.save, np.savetxt
    try:  # the text dumps go through the toolkit's own C++ writer
        from rknn.api import libcpputils2

        native = libcpputils2.cpputils2
        native_savetxt = native.savetxt
    except (ImportError, AttributeError):
        native = native_savetxt = None
    np.save, np.savetxt = caught_save, no_text
    if native is not None:
        native.savetxt = no_text
    try:
        _checked("accuracy_analysis", rknn.accuracy_analysis(inputs=paths, output_dir=snapshot, target=None))
    finally:
        np.save, np.savetxt = save, savetxt
        if native is not None:
            native.savetxt = native_savetxt
    try:
        with open(os.path.join(snapshot, "error_analysis.txt"), errors="replace") as handle:
            text = handle.read()
        layers = []
        with open(os.path.join(snapshot, "map_name_to_file.txt"), errors="replace") as handle:
            rows = [line.split() for line in handle if line.strip() and not line.startswith(("layer_name", "---"))]
        for row in rows:
            name, stem = " ".join(row[:-1]), os.path.splitext(row[-1])[0]
            entry = {"name": name, "file": stem}
            if stem in energies:
                entry.update(energies[stem])
            else:
                try:
                    entry.update(_energies(np.load(os.path.join(snapshot, "golden", "npy", stem + ".npy")),
                                           np.load(os.path.join(snapshot, "simulator", "npy", stem + ".npy"))))
                except (OSError, ValueError) as error:
                    entry["missing"] = str(error).splitlines()[0]
            layers.append(entry)
        with open(job["summary"], "w") as handle:
            json.dump({"error_analysis": text, "layers": layers}, handle)
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)
        for path in paths:
            os.unlink(path)


def own_peak_rss_kb() -> int:
    """This process's own peak resident memory (VmHWM of its address space). Not getrusage's ru_maxrss: Linux
    carries the high-water mark across execve, so a child started by a 10 GB exporting parent reports 10 GB."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def reset_peak_rss() -> None:
    """Start a new high-water mark at the current resident size (Linux >= 4.0; elsewhere the peak runs on)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies, however it dies (a SIGKILLed parent runs no
    cleanup); then check the parent did not die before the request was made."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def main(request_path: str) -> int:
    with open(request_path) as handle:
        request = json.load(handle)
    _die_with_parent(request["parent_pid"])
    events = _Events(request["events_fd"])
    try:
        events.send(stage="import")
        from rknn.api import RKNN

        rknn = RKNN(verbose=True)
        events.send(stage="config")
        dynamic = {"dynamic_input": request["dynamic_input"]} if request.get("dynamic_input") else {}
        if request.get("disable_rules"):
            dynamic["disable_rules"] = request["disable_rules"]
        _checked("config", rknn.config(target_platform=request["target"], float_dtype="float16",
                                       custom_string=request["custom_string"], **dynamic))
        events.send(stage="load")
        # An engine of several shape sets is loaded as it is: naming its inputs with one set's sizes crops the graph
        # to that set, and the other sets then fail to build (KeyError in update_dynamic_shapes; measured).
        crop = {} if dynamic else {"inputs": request["inputs"], "input_size_list": request["input_shapes"]}
        _checked("load_onnx", rknn.load_onnx(model=request["onnx"], **crop))
        events.send(stage="build")
        _checked("build", rknn.build(do_quantization=False))
        if request.get("rknn"):
            events.send(stage="export")
            _checked("export_rknn", rknn.export_rknn(request["rknn"]))
        if request["simulate"]:
            events.send(stage="init_runtime")
            _sessions_without_arena()
            _checked("init_runtime", rknn.init_runtime())  # no target: the simulator, never adb
        events.send(ready=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            run = json.loads(line)
            if "analyse" in run:
                events.send(stage="accuracy_analysis")
                _analyse(rknn, request, run["analyse"])
                events.send(analysed=run["analyse"]["summary"])
                continue
            events.send(stage="simulate")
            _simulate(rknn, request, run)
            events.send(ran=run["outputs"])
        events.send(stage="release")
        rknn.release()
        events.end_stage()
        events.send(done=True, peak_rss_kb=max(events.stage_peaks.values()), stage_peak_rss_kb=events.stage_peaks)
        return 0
    except Exception as error:  # reported to the parent, which raises BuildError with the log tail
        traceback.print_exc()
        # rknn wraps whole tracebacks into its exception text: the last line says what went wrong.
        lines = str(error).strip().splitlines()
        events.send(error=f"{type(error).__name__}: {lines[-1] if lines else ''}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
