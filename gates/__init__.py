"""Numeric and log gates. Each returns a `Verdict`; none of them knows about model families."""
