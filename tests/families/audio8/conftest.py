"""A small random-init Audio8 model and its exported graphs, shared by the audio8 tests (built once)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def small_model():
    from rkaudio.families.audio8 import model as M

    return M.build_random(M.small_config(), seed=0)


@pytest.fixture(scope="session")
def small_plan(small_model, tmp_path_factory):
    from rkaudio.families.audio8 import graphs_job
    from rkaudio.families.audio8.export import export_all

    out = tmp_path_factory.mktemp("audio8_small")
    export_all(graphs_job(out, [128, 256, 512], head_shards=2), small_model)
    return out
