"""The SNR gate: `snr_verdict`, over `rkaudio.board.numeric` (snr_db, max_abs, degenerate_reference), which
the board self-test shares."""
from __future__ import annotations

from rkaudio.board.numeric import degenerate_reference, snr_db
from rkaudio.board.verdict import Verdict, at_least, nothing_to_judge


def snr_verdict(name: str, reference, test, min_db: float, detail: str = "", full_scale: float | None = 1.0) -> Verdict:
    """SNR of `test` against `reference` >= min_db; a degenerate reference (see `degenerate_reference`) fails
    with the reason instead of a figure."""
    problem = degenerate_reference(reference, full_scale)
    if problem is not None:
        return nothing_to_judge(name, min_db, "dB", problem)
    return at_least(name, snr_db(reference, test), min_db, "dB", detail)
