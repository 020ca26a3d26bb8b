"""Random-weight Qwen3-TTS speech-tokenizer decoders, built here, never downloaded."""
from __future__ import annotations

import pytest

from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG, random_reference, step_of


@pytest.fixture(scope="session")
def tiny_reference():
    # Unit gain: the tiny decoder stays well-conditioned (> 100 dB stepwise in fp32) and its attention
    # moves the output more than at the real-shape default of 0.5.
    return random_reference(TINY_CONFIG, seed=0, gain=1.0)


@pytest.fixture(scope="session")
def tiny_step(tiny_reference):
    return step_of(tiny_reference, TINY_CONFIG)


@pytest.fixture(scope="session")
def tiny_snapshot(tmp_path_factory, tiny_reference):
    from rkaudio.families.qwen3_vocoder import snapshot

    return snapshot.write(tmp_path_factory.mktemp("tiny_snapshot"), TINY_CONFIG, tiny_reference.state_dict())


@pytest.fixture(scope="session")
def step_job(tmp_path_factory):
    """The job a direct call of the export stands in (the command's, at rk3588): the contracts' identity."""
    from rkaudio.families.qwen3_vocoder import FAMILY, Source
    from rkaudio.pipeline.declaration import Job

    component = FAMILY.component(None)
    options = FAMILY.options_model(component)(engines=[{"role": "main", "codes_length": 64}])
    return Job(FAMILY, component, Source(), options, FAMILY.gates_model(component)(), "rk3588",
               tmp_path_factory.mktemp("step_job"), "2.3.2")
