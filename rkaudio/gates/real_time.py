"""The real-time gate: can an engine keep up on the board? Its predicted board ms per call
(rkaudio/gates/board_time.py) over the seconds of real time one call covers, which its family declares
(`Family.real_time`: per second of audio produced, of input audio, of generated mel over the ODE, of speech), is
the real-time factor. An engine that keeps an op on the CPU (the cells refused by hand before issue #42) is refused
past `max_real_time_factor` (1.0: slower than real time); one whose every op runs on the NPU records its factor and
ships (CosyVoice3's real-shape rk3566 rungs predict 4.6-5.5x real time: an offline cell, not a CPU-op cell). Each
engine is judged on its own calls; a component whose calls chain several engines (a step and its head shards)
takes their sum."""
from __future__ import annotations

import math
from dataclasses import dataclass

from rkaudio.board.contract import ContractFields
from rkaudio.board.verdict import Verdict, at_most

NAME = "real_time_factor"
UNIT = "x real time"
ADVICE = ("the engine's predicted board time per second of real time is past max_real_time_factor: it cannot keep "
          "up on this SoC. Make the call cheaper (its CPU ops, named in the manifest, first), or raise the threshold "
          "(--max-real-time-factor, a recipe's max_real_time_factor for that target) for offline use")


def only_real_time_failed(verdicts) -> bool:
    """True when the real-time gate is the one gate that failed among `verdicts` (every shape set's): the cell is
    refused by computation (it keeps CPU ops and cannot keep up), not broken; a release reports it as refused."""
    failed = [v for v in verdicts if not v.passed]
    return bool(failed) and all(v.name.split("[")[0] == NAME for v in failed)


@dataclass(frozen=True)
class RealTime:
    """The real time one engine call covers: `seconds` of `unit` ("s of audio", "s of input audio", "s of generated
    mel", "s of speech"), and how the family counts them, with the rates it assumes (`counted`, e.g. "63 emitted
    frames x 256 samples / 22050 Hz")."""

    seconds: float
    unit: str
    counted: str


def real_time_verdict(predicted: dict | None, real_time: RealTime | None, max_factor: float, cpu_ops: int,
                      unjudged: str = "") -> Verdict:
    """`real_time_factor` = predicted ms per call / 1000 / seconds per call, at most `max_factor` when the engine
    keeps `cpu_ops` > 0 CPU ops; with none, the figure is recorded and passes. Not judged (a passed verdict whose
    figure is NaN and whose detail says why) without a prediction (no board-time constants for the SoC) or without
    `real_time` (`unjudged`: why the family gives none)."""
    if predicted is None or real_time is None:
        why = "no board-time constants for this SoC" if predicted is None else unjudged
        return Verdict(NAME, math.nan, float(max_factor), UNIT, True, f"not judged: {why}")
    factor = predicted["ms"] / 1000.0 / real_time.seconds
    caveat = ("; the SoC's board-time constants are unfitted (no board figure of it)"
              if predicted.get("basis", "").startswith("unfitted") else "")
    detail = (f"{predicted['ms']:,.3f} ms predicted per call of {real_time.seconds:.4g} {real_time.unit} "
              f"({real_time.counted}){caveat}")
    verdict = at_most(NAME, float(f"{factor:.4g}"), max_factor, UNIT,
                      f"{detail}; keeps {cpu_ops} CPU op{'s' * (cpu_ops != 1)}" if cpu_ops else detail)
    if cpu_ops == 0 and not verdict.passed:
        return Verdict(**{**verdict.__dict__, "passed": True,
                          "detail": f"{detail}; not gated: no op on the CPU (the gate refuses a cell that keeps "
                                    f"CPU ops and cannot keep up)"})
    return verdict


@dataclass(frozen=True)
class OutputRate(ContractFields):
    """The sample rate of the audio an engine's walk produces (a Piper or Inflect decoder window's contract)."""

    sample_rate: int


def window_walk(contract) -> RealTime:
    """A window walk's call (`rkaudio.board.window_walk.WindowContract`, `hop` in output samples per frame): the
    audio of the frames it keeps, emitted x hop / sample rate."""
    from rkaudio.board.window_walk import WindowContract

    window, rate = WindowContract.of(contract), OutputRate.of(contract).sample_rate
    return RealTime(window.emitted * window.hop / rate, "s of audio",
                    f"{window.emitted} emitted frames x {window.hop} samples / {rate} Hz")
