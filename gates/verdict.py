"""The one verdict type every gate returns, and `require`, which stops a build on a failed one."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from core.errors import GateFailure


@dataclass(frozen=True)
class Verdict:
    """One gate's outcome: `value` compared with `threshold` in `unit`; `bound` says which way it passes
    ("at_least", "at_most", or "" for a verdict made directly)."""

    name: str
    value: float
    threshold: float
    unit: str
    passed: bool
    detail: str = ""
    bound: str = ""

    def to_json(self) -> dict:
        out = asdict(self)
        # JSON has no inf/nan: an exact match (inf dB) is written as a string so readers see it.
        for key in ("value", "threshold"):
            if isinstance(out[key], float) and not math.isfinite(out[key]):
                out[key] = str(out[key])
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Verdict":
        """Inverse of `to_json` (non-finite figures come back from their strings)."""
        return cls(data["name"], float(data["value"]), float(data["threshold"]), data["unit"], bool(data["passed"]),
                   data.get("detail", ""), data.get("bound", ""))

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


def worst_snr_db(gates: list[dict]) -> float | None:
    """The lowest SNR among gate records (`Verdict.to_json`): dB figures that must be at least a threshold. An
    at-most gate in dB (a figure that must stay low, e.g. a masked-padding leak) is not an SNR."""
    # float(): to_json writes non-finite figures as strings ("inf", "-inf", "nan")
    snrs = [float(g["value"]) for g in gates if g.get("unit") == "dB" and g.get("bound", "") != "at_most"]
    return min(snrs) if snrs else None


def require(verdicts: list[Verdict], advice: str = "", context: str = "") -> list[Verdict]:
    """Return `verdicts` unchanged if all passed, else raise `GateFailure` naming the failures."""
    failed = [v for v in verdicts if not v.passed]
    if failed:
        raise GateFailure(failed, advice=advice, context=context)
    return verdicts
