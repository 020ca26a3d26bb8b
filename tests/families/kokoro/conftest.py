"""The small random-init Kokoro generator (kokoro_small.SMALL) and its export at FRAMES, made once per session."""
from __future__ import annotations

import pytest

from tests.kokoro_small import FRAMES, SMALL, small_job, small_reference


@pytest.fixture(scope="session")
def state():
    """The small generator's state (weight norm in) with non-trivial alphas and gains."""
    return small_reference()[1]


@pytest.fixture(scope="session")
def exported(state, tmp_path_factory):
    """The real export of the small model (round form: the engine ONNX and its exact fp32 twin): its record,
    contract and the golden utterance."""
    from rkaudio.families.kokoro.export import export, golden_utterance
    from rkaudio.core.contract import contract_of

    [record] = export(small_job(tmp_path_factory.mktemp("kokoro_export")), SMALL, state, "random", "round")
    utterance, label, real = golden_utterance(SMALL, FRAMES, None)
    assert not real
    return record, contract_of(record.onnx), utterance, label
