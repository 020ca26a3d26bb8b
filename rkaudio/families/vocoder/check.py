"""`convert check vocoder`: a white-noise latent walked window by window over the engine (onnxruntime's fp16 estimate
or the toolkit simulator) and over the engine's fp32 graph, beside the dynamic graph's full-length run of the same
latent; the three renders heard and drawn (rkaudio.host.hearing)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def render_check(model: Path, engine: Path, engines, frames: int, seed: int, out: Path) -> dict:
    """Write `out` (`engine`'s walk), `<out>.fp32.wav`, `<out>.full.wav` and `<out>.png` (rkaudio.host.hearing.compare);
    returns the figures."""
    from rkaudio.board.window_walk import WindowContract, walk
    from rkaudio.core.manifest import engine_contract
    from rkaudio.gates.real_time import OutputRate
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.host.hearing import Render, compare, spans_of_walk

    contract = engine_contract(engine)
    layout, rate = WindowContract.of(contract), OutputRate.of(contract).sample_rate
    shape = [1, layout.latent_channels, frames]
    if layout.time_axis is not None:
        shape = [1, frames, layout.latent_channels]
    latent = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    fp32 = walk(engines.fp32(engine), latent, layout)
    with engines.open(engine) as backend:
        rendered = walk(backend, latent, layout).output
    full = OnnxBackend(model).run({layout.latent_input: latent})[layout.output]
    title = (f"vocoder {Path(engine).stem}, W={layout.window} C={layout.context}, {frames} latent frames "
             f"({engines.label})")
    return compare(out, Render(fp32.output.reshape(-1), rate), Render(np.reshape(rendered, -1), rate),
                   spans_of_walk(fp32), title=title, full=Render(np.reshape(full, -1), rate),
                   apart_from_full=apart_from_full(contract))


def apart_from_full(contract) -> str:
    """What sets the fp32 walk apart from the full-length run: the windowing, and the approximating `--fix` passes
    the engine's fp32 graph kept (its export verdicts name them)."""
    from rkaudio.engine.doctor import FIXES

    approximating = {fix.name for fix in FIXES if not fix.exact}
    kept = [entry["name"][len("fix:"):] for entry in contract.export_verdicts or []
            if entry["name"].startswith("fix:") and entry["name"][len("fix:"):] in approximating]
    return "the windowing" + (f" and the approximating {', '.join(kept)}" if kept else " alone")
