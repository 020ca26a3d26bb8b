"""`convert check cosyvoice3`: one ODE rendered to the mel through the flow-estimator ladder twice, through the
fp32 ONNX and through the engine (onnxruntime or the toolkit simulator), with the runtime's own loop
(rkaudio.board.cosyvoice3.FlowLadder.solve) on the kind of seeded conditioning the end-to-end golden uses (noise,
mu, spks, and cond holding a prompt over the first third); shown by rkaudio.host.hearing like every check. There is
no vocoder here, so the mel [80, frames] is the render (.npy, plotted as it is) and nothing is heard.

Spans: the prompt frames and the generated frames. Every engine call of the ODE covers every frame (one rung,
right-padded), so a span per call would repeat the whole mel; the split shows whether the engine's error sits
where cond gives the model the answer or where the model invents it. How that error grows is printed beside: the
engine's x against the fp32 x after each ODE step."""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rkaudio.board.contract import EngineContract
from rkaudio.board.cosyvoice3 import FlowFields, RungFields
from rkaudio.core.errors import SetupError


@dataclass(frozen=True)
class EstimatorOnnx:
    """One estimator ONNX and its contract: what FlowLadder.from_engines groups into rungs (the parts of a
    depth-split rung chained) and chooses among, before any backend is opened."""

    path: Path
    contract: EngineContract


def estimator_ladder(paths: list[Path], family: str):
    """FlowLadder over EstimatorOnnx records (no backend): the rungs the ONNX make, for choosing one; each must be
    `family`'s (as contracts name it)."""
    from rkaudio.core.contract import contract_of
    from rkaudio.board.cosyvoice3 import FlowLadder

    records = [EstimatorOnnx(Path(path), contract_of(path)) for path in paths]
    for record in records:
        if record.contract.family != family:
            raise SetupError(f"{record.path} is not a flow estimator written by `convert cosyvoice3` (its contract "
                             f"names family {record.contract.family!r})")
    try:
        return FlowLadder.from_engines(records)
    except ValueError as error:
        raise SetupError(f"the estimator ONNX do not make a ladder: {error}") from None


def render_check(onnx: list[Path], family: str, frames: int | None, steps: int, seed: int, out: Path,
                 engines) -> dict:
    """Write `out` (the engine's mel, .npy), `<stem>.fp32.npy` (the same ODE through fp32) and `<stem>.png`; print
    the engine's SNR against fp32 on the prompt and generated frames, overall and after each ODE step. `onnx` are
    the ladder's estimator ONNX (their contracts naming `family`); `frames` (default: the end-to-end golden's, on
    the smallest rung) picks the rung, the smallest that holds them, and only that rung is opened (a simulator
    compile per rung, or per part of a split one). Returns the figures."""
    from rkaudio.families.cosyvoice3.export import ode_inputs, padded_frames, prompt_frames
    from rkaudio.board.cosyvoice3 import Chain, FlowLadder, FlowLengthError
    from rkaudio.board.numeric import snr_db
    from rkaudio.host.hearing import Render, Span, compare

    out = Path(out)
    choice = estimator_ladder(onnx, family)
    frames = frames or padded_frames(min(choice.rungs))
    try:
        rung = choice.rung_for(frames)
    except FlowLengthError as error:
        raise SetupError(str(error)) from None
    chosen = choice.rungs[rung]
    parts = chosen.parts if isinstance(chosen, Chain) else [chosen]
    flow = FlowFields.of(parts[0].contract)
    spk = next(entry["shape"][-1] for entry in RungFields.of(parts[0].contract).io["inputs"] if entry["name"] == "spks")
    inputs = ode_inputs(flow.mel_dim, spk, frames, seed)

    def render(backends: list, trajectory: list) -> np.ndarray:
        ladder = FlowLadder({rung: backends}, flow)
        return ladder.solve(inputs["noise"], inputs["mu"], inputs["spks"], inputs["cond"], steps=steps,
                            trajectory=trajectory)[0]

    fp32_steps, engine_steps = [], []
    fp32 = render([engines.fp32(part.path) for part in parts], fp32_steps)
    with ExitStack() as opened:
        engine = render([opened.enter_context(engines.open(part.path)) for part in parts], engine_steps)
    prompt = prompt_frames(frames)
    spans = [span for span in (Span(0, prompt, "prompt"), Span(prompt, frames, "generated")) if span.stop > span.start]
    split = f" in {len(parts)} parts" if len(parts) > 1 else ""
    title = (f"cosyvoice3 flow mel, {frames} frames on the S={rung} rung{split}, {steps}-step ODE "
             f"({engines.label})")
    rate = float(flow.frame_rate_hz)
    figures = compare(out, Render(fp32, rate), Render(engine, rate), spans, title=title)
    figures["steps_snr_db"] = [snr_db(a, b) for a, b in zip(fp32_steps, engine_steps)]
    print("engine x vs fp32 x after each ODE step: "
          + ", ".join(f"{value:.1f}" for value in figures["steps_snr_db"]) + " dB")
    return figures
