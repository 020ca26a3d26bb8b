"""What the engine build and `convert diagnose` share, below both: the self-check feeds checked against the
engine's inputs, and the per-layer analysis (rknn-toolkit2's accuracy_analysis) of the engine a ready
converter child holds, reduced by `rkaudio.gates.layer_error`. `rkaudio.engine.build` runs it when its simulator gate
fails; `rkaudio.engine.diagnose` runs it on demand."""
from __future__ import annotations

from rkaudio.core.errors import SetupError


def checked_feeds(specs, feeds: dict, what: str) -> dict:
    """`feeds` in the engine's input order and dtypes; SetupError for a missing input or a wrong shape."""
    import numpy as np

    wrong = [f"{s.name} {None if s.name not in feeds else feeds[s.name].shape} (ONNX {s.shape})" for s in specs
             if s.name not in feeds or tuple(feeds[s.name].shape) != tuple(s.shape)]
    if wrong:
        raise SetupError(f"{what} does not fit the engine's inputs: {', '.join(wrong)}")
    return {s.name: np.asarray(feeds[s.name], dtype=s.dtype) for s in specs}


def analyse_in_child(child, feeds: dict, model, stages: dict | None = None) -> list:
    """The per-layer table of the engine `child` built (a ready ConverterChild with the simulator)."""
    from rkaudio.gates.layer_error import layer_table

    return layer_table(child.analyse(feeds), model, stages)
