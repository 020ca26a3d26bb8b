"""Stopping a build on a failed verdict (`rkaudio.board.verdict.Verdict`, the one verdict type): `require` for
any failed gate, `refuse_degenerate` for a gate that had nothing to judge."""
from __future__ import annotations

from rkaudio.core.errors import GateFailure
from rkaudio.board.numeric import DEGENERATE_ADVICE
from rkaudio.board.verdict import Verdict


def require(verdicts: list[Verdict], advice: str = "", context: str = "") -> list[Verdict]:
    """Return `verdicts` unchanged if all passed, else raise `GateFailure` naming the failures."""
    failed = [v for v in verdicts if not v.passed]
    if failed:
        raise GateFailure(failed, advice=advice, context=context)
    return verdicts


def refuse_degenerate(verdicts: list[Verdict], context: str) -> list[Verdict]:
    """Stop when a gate had nothing to judge (`Verdict.degenerate`: its whole reference is silent, constant or
    not finite, e.g. a snapshot whose model outputs zeros): that needs the checkpoint or the inputs fixed, not the
    advice of the gate itself, and none of the other figures can mean anything then. `GateFailure` naming those
    gates, with `context` ("<family> export", the file); returns `verdicts` otherwise."""
    degenerate = [v for v in verdicts if v.degenerate]
    if degenerate:
        raise GateFailure(degenerate, advice=DEGENERATE_ADVICE, context=context)
    return verdicts
