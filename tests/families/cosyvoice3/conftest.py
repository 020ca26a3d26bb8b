"""Tiny random-weight CosyVoice3 flow estimators, built here, never downloaded."""
from __future__ import annotations

import pytest

TINY_LENGTHS = [24, 32]


@pytest.fixture(scope="session")
def tiny_model():
    from rkaudio.families.cosyvoice3.snapshot import TINY_CONFIG, random_estimator

    return random_estimator(TINY_CONFIG, seed=0)


@pytest.fixture(scope="session")
def tiny_model64(tiny_model):
    import copy

    return copy.deepcopy(tiny_model).double()


@pytest.fixture(scope="session")
def flow_job():
    """`flow_job(out, **options)`: the job of a direct call of the export (the command's on the tiny random weights,
    at rk3588) exporting the TINY_LENGTHS rungs (or `options`') into `out`."""
    def job(out, **options):
        from rkaudio.families.cosyvoice3 import FAMILY, Source
        from rkaudio.pipeline.declaration import Job

        component = FAMILY.component(None)
        return Job(FAMILY, component, Source(random_weights="small"),
                   FAMILY.options_model(component)(**{"lengths": TINY_LENGTHS, **options}),
                   FAMILY.gates_model(component)(), "rk3588", out, "2.3.2")
    return job


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory, flow_job, tiny_model):
    """Two rungs (S=24, 32) exported with their gates and the end-to-end golden (no engine)."""
    from rkaudio.families.cosyvoice3.export import export
    from rkaudio.families.cosyvoice3.snapshot import DEFAULT_CFM

    return export(flow_job(tmp_path_factory.mktemp("cosyvoice3_tiny")), tiny_model, DEFAULT_CFM, say=lambda _: None)


@pytest.fixture
def check_cli():
    """`convert check cosyvoice3 ARGS...` in-process -> typer's Result (a SetupError stays in `.exception`)."""
    def invoke(*args: str):
        from typer.testing import CliRunner

        from rkaudio.cli import _register_all, app

        _register_all()
        return CliRunner().invoke(app, ["check", "cosyvoice3", *args])
    return invoke
