"""Shared fixtures. Family folders under tests/ add their own conftest.py."""
from __future__ import annotations

import pytest

from core.errors import SetupError
from toolkit.versions import converter_python


def converter_available(version: str) -> bool:
    try:
        converter_python(version)
        return True
    except SetupError:
        return False


@pytest.fixture
def require_converter():
    """Fails (never skips) when the converter venv is missing: `make test` creates both."""
    def check(version: str = "2.3.2") -> None:
        converter_python(version)  # raises SetupError with the make command to run
    return check
