"""Numeric and log gates. Each returns a `runtime.board.verdict.Verdict`; none of them knows about model families."""
