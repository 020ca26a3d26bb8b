"""The one verdict type: what every gate returns, what a manifest lists and what the board self-test report
writes per output. A gate whose reference cannot judge anything (silent, constant, non-finite) says so in words
(`degenerate`), never by a sentinel figure. `rkaudio.gates.verdict.require` stops a build on a failed one. Shipped in the
self-test kit: numpy and the stdlib only, Python 3.8 syntax."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from rkaudio.board.numeric import DEGENERATE_ADVICE, degenerate_reference


@dataclass(frozen=True)
class Verdict:
    """One gate's outcome: `value` compared with `threshold` in `unit`; `bound` says which way it passes
    ("at_least", "at_most", or "" for a verdict made directly); `advice` says what to do when it fails.
    `degenerate`, when set, is why the gate had nothing to judge (its whole reference is silent, constant or not
    finite): the gate fails with that reason as its detail and no figure (`value` is NaN)."""

    name: str
    value: float
    threshold: float
    unit: str
    passed: bool
    detail: str = ""
    bound: str = ""
    advice: str = ""
    degenerate: str = ""

    @property
    def outcome(self) -> str:
        """The verdict in one word: "passed", "failed" or "degenerate" (nothing to judge)."""
        return "degenerate" if self.degenerate else "passed" if self.passed else "failed"

    def to_json(self) -> dict:
        out = asdict(self)
        # JSON has no inf/nan: an exact match (inf dB) is written as a string so readers see it.
        for key in ("value", "threshold"):
            if isinstance(out[key], float) and not math.isfinite(out[key]):
                out[key] = str(out[key])
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Verdict":
        """Inverse of `to_json` (non-finite figures come back from their strings; a record written before
        `advice` and `degenerate` existed reads with both empty)."""
        return cls(data["name"], float(data["value"]), float(data["threshold"]), data["unit"], bool(data["passed"]),
                   data.get("detail", ""), data.get("bound", ""), data.get("advice", ""), data.get("degenerate", ""))

    def line(self) -> str:
        mark = "PASS" if self.passed else "FAIL"
        text = f"[{mark}] {self.name}: {self.value:.4g} {self.unit} (threshold {self.threshold:.4g})"
        return f"{text}  {self.detail}" if self.detail else text


def at_least(name: str, value: float, threshold: float, unit: str, detail: str = "") -> Verdict:
    """A gate that passes when `value >= threshold` (SNR-like figures; NaN never passes)."""
    return Verdict(name, float(value), float(threshold), unit, bool(value >= threshold), detail, "at_least")


def at_most(name: str, value: float, threshold: float, unit: str, detail: str = "") -> Verdict:
    """A gate that passes when `value <= threshold` (counts, error magnitudes; NaN never passes)."""
    return Verdict(name, float(value), float(threshold), unit, bool(value <= threshold), detail, "at_most")


def nothing_to_judge(name: str, threshold: float, unit: str, problem: str) -> Verdict:
    """The gate `name`, failed because its reference cannot judge anything: `problem` (the reason, in words) is
    its detail and its `degenerate`, there is no figure, and the advice is to fix the checkpoint or the inputs."""
    return Verdict(name, math.nan, float(threshold), unit, False, problem, "", DEGENERATE_ADVICE, problem)


def judged(verdict: Verdict, reference, full_scale: float | None = 1.0, label: str = "", check=None) -> Verdict:
    """`verdict`, or the same gate failed with nothing to judge (`nothing_to_judge`) when the whole `reference`
    it compared with is degenerate: `check(reference)` says why when given, else
    `rkaudio.board.numeric.degenerate_reference(reference, full_scale)` (full scale 1.0 for audio, None where
    there is none). `label` prefixes the reason (which of several outputs it was)."""
    problem = check(reference) if check is not None else degenerate_reference(reference, full_scale)
    if problem is None:
        return verdict
    return nothing_to_judge(verdict.name, verdict.threshold, verdict.unit, f"{label}: {problem}" if label else problem)


def worst_snr_db(gates: list[dict]) -> float | None:
    """The lowest SNR among gate records (`Verdict.to_json`): dB figures that must be at least a threshold. An
    at-most gate in dB (a figure that must stay low, e.g. a masked-padding leak) is not an SNR."""
    # float(): to_json writes non-finite figures as strings ("inf", "-inf", "nan")
    snrs = [float(g["value"]) for g in gates if g.get("unit") == "dB" and g.get("bound", "") != "at_most"]
    return min(snrs) if snrs else None
