"""The one verdict type every gate returns, and the failure that stops a build."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Verdict:
    """One gate's outcome: `value` compared with `threshold` in `unit`."""

    name: str
    value: float
    threshold: float
    unit: str
    passed: bool
    detail: str = ""

    def to_json(self) -> dict:
        out = asdict(self)
        # JSON has no inf/nan: an exact match (inf dB) is written as a string so readers see it.
        for key in ("value", "threshold"):
            if isinstance(out[key], float) and not math.isfinite(out[key]):
                out[key] = str(out[key])
        return out

    def line(self) -> str:
        mark = "PASS" if self.passed else "FAIL"
        text = f"[{mark}] {self.name}: {self.value:.4g} {self.unit} (threshold {self.threshold:.4g})"
        return f"{text}  {self.detail}" if self.detail else text


def at_least(name: str, value: float, threshold: float, unit: str, detail: str = "") -> Verdict:
    """A gate that passes when `value >= threshold` (SNR-like figures; NaN never passes)."""
    return Verdict(name, float(value), float(threshold), unit, bool(value >= threshold), detail)


def at_most(name: str, value: float, threshold: float, unit: str, detail: str = "") -> Verdict:
    """A gate that passes when `value <= threshold` (counts, error magnitudes; NaN never passes)."""
    return Verdict(name, float(value), float(threshold), unit, bool(value <= threshold), detail)


@dataclass
class GateFailure(Exception):
    """Raised when a gate fails: carries the failing verdicts and what the user should do."""

    verdicts: list[Verdict]
    advice: str = ""
    context: str = ""
    extra: dict = field(default_factory=dict)

    def __str__(self) -> str:
        head = f"{self.context}: " if self.context else ""
        lines = [head + "gate failed"] + ["  " + v.line() for v in self.verdicts if not v.passed]
        if self.advice:
            lines.append("  what to do: " + self.advice)
        return "\n".join(lines)


def require(verdicts: list[Verdict], advice: str = "", context: str = "") -> list[Verdict]:
    """Return `verdicts` unchanged if all passed, else raise `GateFailure` naming the failures."""
    failed = [v for v in verdicts if not v.passed]
    if failed:
        raise GateFailure(failed, advice=advice, context=context)
    return verdicts
