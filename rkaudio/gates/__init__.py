"""Numeric and log gates. Each returns a `rkaudio.board.verdict.Verdict`; none of them knows about model families."""
