"""The declaration a fixture carries when it loads a real checkpoint (the joe Piper voice, the packaged Kokoro model)
or builds a real-size model: every test that requests it, directly or through another fixture, is `slow`, so it
runs in the one slow group of `make test` and is left out of `make test-quick` (tests/structure/test_slow_marks.py
checks it). Declare it under the fixture decorator:

    @pytest.fixture(scope="session")
    @real_checkpoint
    def joe(): ...
"""
from __future__ import annotations

DECLARED = "loads_a_real_checkpoint"


def real_checkpoint(fixture_function):
    setattr(fixture_function, DECLARED, True)
    return fixture_function


def loads_a_real_checkpoint(fixture_function) -> bool:
    return getattr(fixture_function, DECLARED, False)
