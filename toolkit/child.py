"""Child process that compiles one fixed-shape ONNX with rknn-toolkit2 (runs in a converter venv).

Usage: `python -m toolkit.child REQUEST.json`, cwd = a fresh temporary directory (verbose mode
writes check*.onnx there), fds 1 and 2 = the build log (the native compiler writes to them directly).
Imports only the stdlib, numpy and rknn: the converter venv holds nothing else of rkaudio's world.

Request keys: onnx, target, inputs (names), input_shapes, custom_string, rknn (path to export to, or
null), outputs (names), simulate (bool: start the simulator), events_fd (a pipe write end inherited
from the parent), parent_pid (the child dies with it).
Every step is announced on the events pipe as one JSON line ({"stage": ...}) *before* it starts, so the
parent can name the stage in which a signal killed the child. After the build, the child answers run
requests read from stdin, one JSON line each ({"inputs": npz, "outputs": npz}), until stdin closes:
the simulator only runs the engine built in this process (it refuses engines loaded from disk)."""
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
    def __init__(self, fd: int):
        self._stream = os.fdopen(fd, "w", buffering=1)

    def send(self, **event) -> None:
        self._stream.write(json.dumps(event) + "\n")
        self._stream.flush()
        # Mirror into the log so a reader of the build log sees where each stage starts.
        print(f"[rkaudio] {json.dumps(event)}", file=sys.stderr, flush=True)


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
        _checked("config", rknn.config(target_platform=request["target"], float_dtype="float16",
                                       custom_string=request["custom_string"]))
        events.send(stage="load")
        _checked("load_onnx", rknn.load_onnx(model=request["onnx"], inputs=request["inputs"],
                                             input_size_list=request["input_shapes"]))
        events.send(stage="build")
        _checked("build", rknn.build(do_quantization=False))
        if request.get("rknn"):
            events.send(stage="export")
            _checked("export_rknn", rknn.export_rknn(request["rknn"]))
        if request["simulate"]:
            events.send(stage="init_runtime")
            _checked("init_runtime", rknn.init_runtime())  # no target: the simulator, never adb
        events.send(ready=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            events.send(stage="simulate")
            run = json.loads(line)
            _simulate(rknn, request, run)
            events.send(ran=run["outputs"])
        events.send(stage="release")
        rknn.release()
        import resource

        events.send(done=True, peak_rss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        return 0
    except Exception as error:  # reported to the parent, which raises BuildError with the log tail
        traceback.print_exc()
        # rknn wraps whole tracebacks into its exception text: the last line says what went wrong.
        lines = str(error).strip().splitlines()
        events.send(error=f"{type(error).__name__}: {lines[-1] if lines else ''}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
