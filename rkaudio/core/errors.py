"""Every error a user can meet, in one place. The CLI maps them to exit codes once:
SetupError 2 (fix something before anything is built), GateFailure 3 (an artifact failed a gate),
BuildError 4 (the converter child died or the toolkit failed). MissingSource is a skip, not a failure."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rkaudio.board.errors import SetupError  # defined with the board modules, which raise it too


class MissingSource(Exception):
    """A recipe's checkpoint is not on this machine; the message names it and how to supply it."""


class PackageError(ValueError):
    """The engines of one package cannot form a consistent execution plan."""


@dataclass
class GateFailure(Exception):
    """A gate failed: carries the failing verdicts (`rkaudio.board.verdict.Verdict`) and what the user should do."""

    verdicts: list
    advice: str = ""
    context: str = ""
    extra: dict = field(default_factory=dict)

    def __str__(self) -> str:
        head = f"{self.context}: " if self.context else ""
        lines = [head + "gate failed"] + ["  " + v.line() for v in self.verdicts if not v.passed]
        if self.advice:
            lines.append("  what to do: " + self.advice)
        return "\n".join(lines)


class BuildError(RuntimeError):
    """The converter child failed: killed by a signal, or the toolkit raised / returned an error."""

    def __init__(self, stage: str, reason: str, log_tail: list[str], log_path: Path | None = None):
        self.stage, self.reason, self.log_tail, self.log_path = stage, reason, log_tail, log_path
        where = f" (full log: {log_path})" if log_path else ""
        tail = "\n".join("    " + line for line in log_tail)
        super().__init__(f"engine build failed in stage '{stage}': {reason}{where}\n  last log lines:\n{tail}")


EXIT_CODES = ((SetupError, 2), (GateFailure, 3), (BuildError, 4))


def exit_code(error: BaseException) -> int | None:
    """The CLI exit code of a user-facing error, None for anything else (a bug: let it raise)."""
    return next((code for kind, code in EXIT_CODES if isinstance(error, kind)), None)
