"""REGTASK gate: the compiler's 'bit width of field value exceeds the limit' lines, parsed from a build log.

The toolkit logs them and still returns success, but each one is an op whose axis does not fit its
register field on that SoC: the engine can compute garbage on the board while the simulator looks fine."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from rkaudio.core.manifest import worst_overflow
from rkaudio.board.verdict import Verdict, at_most

REGTASK_LINE = re.compile(
    r"REGTASK: The bit width of field value exceeds the limit, target: (?P<target>\w+), "
    r"offset: (?P<offset>0x[0-9a-fA-F]+), shift = (?P<shift>\d+), limit: (?P<limit>0x[0-9a-fA-F]+), "
    r"value: (?P<value>0x[0-9a-fA-F]+)")

# What a failed gate prints after "what to do:": the remedy first, then why, then the one deliberate way out.
ADVICE = ("export a narrower window (a shorter time axis per engine) or hold the long axis as polyphase phases (a "
          "family command does this per --target): an op's axis longer than its register field (value > limit) "
          "corrupts the engine on the board, and the simulator cannot see it; raise --max-regtask-lines (a recipe's "
          "[gates] max_regtask_lines) only on purpose, after a board run of this engine passes")


@dataclass
class RegtaskReport:
    lines: int = 0
    worst_ratio: float = 0.0  # largest value/limit seen (0 when there are no lines)
    fields: list[dict] = field(default_factory=list)  # per (target field set, offset, limit): lines, worst value

    def to_json(self) -> dict:
        return {"lines": self.lines, "worst_ratio": self.worst_ratio, "fields": self.fields}


def parse_regtask(log_text: str) -> RegtaskReport:
    """Count REGTASK lines in `log_text`, with the worst value/limit ratio and the register fields involved."""
    report = RegtaskReport()
    by_field: dict[tuple[str, str, int], dict] = {}
    for match in REGTASK_LINE.finditer(log_text):
        limit, value = int(match["limit"], 16), int(match["value"], 16)
        report.lines += 1
        report.worst_ratio = max(report.worst_ratio, value / limit)
        key = (match["target"], match["offset"].lower(), limit)
        entry = by_field.setdefault(key, {"target": key[0], "offset": key[1], "limit": limit, "lines": 0,
                                          "worst_value": 0})
        entry["lines"] += 1
        entry["worst_value"] = max(entry["worst_value"], value)
    report.fields = list(by_field.values())
    return report


def regtask_verdict(report: RegtaskReport, max_lines: int) -> Verdict:
    """At most `max_lines` REGTASK lines; the detail names the worst overflow and every field involved."""
    detail = worst_overflow(report.to_json())
    if report.fields:
        detail += "; fields " + ", ".join(f"{f['target']}@{f['offset']} limit {f['limit']:#x} x{f['lines']}"
                                          for f in report.fields)
    return at_most("regtask_lines", report.lines, max_lines, "lines", detail)
