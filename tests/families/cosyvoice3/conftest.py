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
def tiny_export(tmp_path_factory, tiny_model):
    """Two rungs (S=24, 32) exported with their gates and the end-to-end golden (no engine)."""
    from rkaudio.families.cosyvoice3.export import export
    from rkaudio.families.cosyvoice3.snapshot import DEFAULT_CFM

    out = tmp_path_factory.mktemp("cosyvoice3_tiny")
    return export(tiny_model, DEFAULT_CFM, TINY_LENGTHS, out, target="rk3588", say=lambda _: None)


@pytest.fixture
def check_cli():
    """`convert check cosyvoice3 ARGS...` in-process -> typer's Result (a SetupError stays in `.exception`)."""
    def invoke(*args: str):
        from typer.testing import CliRunner

        from rkaudio.cli import _register_all, app

        _register_all()
        return CliRunner().invoke(app, ["check", "cosyvoice3", *args])
    return invoke
