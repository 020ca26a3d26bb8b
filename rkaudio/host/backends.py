"""Host backends with one interface, `run(feeds) -> outputs` (dicts keyed by tensor name) plus `input_names` /
`output_names` and `input_dtypes` (the numpy dtype each input is fed in): onnxruntime, the rknn-toolkit2 simulator (converter-venv child) and rknnlite on a board.
The window walks, streams and bucket loops in rkaudio/board/ run over any of them. The board's backend
(rknnlite) is `rkaudio.board.rknnlite.RknnLiteBackend`: it ships in the self-test kit, numpy and rknnlite alone."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rkaudio.toolkit.versions import DEFAULT_TOOLKIT


class OnnxBackend:
    """onnxruntime fp32 on the CPU: the reference every engine is gated against, and the one place rkaudio
    opens an onnxruntime session. `model` is an ONNX path, serialized bytes or an onnx.ModelProto;
    `extra_outputs` names intermediate tensors to return too (taps); `threads` caps intra-op threads."""

    def __init__(self, model, extra_outputs: tuple[str, ...] = (), threads: int | None = None):
        import onnxruntime as ort

        if extra_outputs:
            import onnx

            model = onnx.load(str(model)) if isinstance(model, (str, Path)) else model
            model = onnx.load_from_string(model) if isinstance(model, bytes) else model
            tapped = onnx.ModelProto()
            tapped.CopyFrom(model)
            known = {o.name for o in tapped.graph.output}
            tapped.graph.output.extend(onnx.ValueInfoProto(name=name) for name in extra_outputs if name not in known)
            model = tapped
        if isinstance(model, (str, Path)):
            source = str(model)
        elif isinstance(model, bytes):
            source = model
        else:
            source = model.SerializeToString()
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self._session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]
        self.input_dtypes = {i.name: _numpy_dtype(i.type) for i in self._session.get_inputs()}

    def run(self, feeds: dict, outputs: list[str] | None = None) -> dict:
        """Outputs by name (all graph outputs, or just `outputs`); feeds beyond the graph's inputs are ignored.
        A feed in another dtype than the graph's input (a self-check input stored as an engine is fed it, fp16,
        `rkaudio.core.contract.fed_inputs`, while the ONNX takes fp32) is cast here, at the boundary."""
        names = list(outputs) if outputs is not None else self.output_names
        values = self._session.run(names, {name: np.asarray(feeds[name], dtype=self.input_dtypes[name])
                                           for name in self.input_names})
        return dict(zip(names, values))

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


def _numpy_dtype(ort_type: str) -> np.dtype:
    """numpy's dtype of an onnxruntime input type ('tensor(float)' -> float32, 'tensor(float16)' -> float16)."""
    name = ort_type[len("tensor("):-1]
    return np.dtype({"float": "float32", "double": "float64"}.get(name, name))


class SimulatorBackend:
    """The toolkit simulator: a converter-venv child that compiles `onnx_path` once (no engine file is
    written) and serves runs until closed. It emulates fp16, not the compiled engine (REGTASK damage is
    invisible to it). Use as a context manager so the child always exits."""

    def __init__(self, onnx_path, target: str, toolkit: str = DEFAULT_TOOLKIT, timeout_s: float | None = None):
        from rkaudio.core.contract import contract_of, fed_inputs
        from rkaudio.toolkit.session import ConverterChild

        self._child = ConverterChild(Path(onnx_path), target, toolkit, log_path=None, rknn_path=None, simulate=True,
                                     timeout_s=timeout_s)
        try:
            self._child.wait_ready()
        except BaseException:
            self._child.kill()
            raise
        self.input_names = [s.name for s in self._child.inputs]
        self.output_names = [s.name for s in self._child.outputs]
        # the simulator stands for the engine, so it is fed as the engine is (it takes fp16 or fp32 alike)
        self.input_dtypes = {entry["name"]: np.dtype(entry["dtype"]) for entry in
                             fed_inputs([s.to_json() for s in self._child.inputs], contract_of(Path(onnx_path)))}

    def run(self, feeds: dict) -> dict:
        return self._child.run({name: feeds[name] for name in self.input_names})

    def close(self) -> None:
        self._child.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            self.close()
        else:
            self._child.kill()
