"""The one error the board modules raise for a problem the user fixes (a wrong engine, a missing file, a bad
input). `rkaudio.core.errors` takes it from here, so the host and the board raise the same class and the CLI maps it
to exit 2 once. Shipped in the self-test kit: the stdlib only, Python 3.8 syntax."""
from __future__ import annotations


class SetupError(RuntimeError):
    """A problem the user fixes before anything is built (bad target, missing venv, bad input)."""
