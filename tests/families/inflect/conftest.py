"""Micro- and Nano-shaped Inflect v2 models with random weights, exported with the official I/O, and
their fixed-window slices (with and without the decoder-half mask), built once per session."""
from __future__ import annotations

import pytest

from rkaudio.families.inflect.reference import MICRO, NANO


def _export(cfg, tmp_path_factory):
    from rkaudio.families.inflect.reference import export_official

    return cfg, export_official(tmp_path_factory.mktemp(f"inflect_{cfg.name}"), cfg, seed=0)


@pytest.fixture(scope="session")
def micro_official(tmp_path_factory):
    """(config, paths) of the Micro-shaped model's decode.onnx / duration.onnx / config.json."""
    return _export(MICRO, tmp_path_factory)


@pytest.fixture(scope="session")
def nano_official(tmp_path_factory):
    return _export(NANO, tmp_path_factory)


@pytest.fixture(scope="session", params=["micro", "nano"])
def official(request):
    """Each size in turn."""
    return request.getfixturevalue(f"{request.param}_official")


def write_slice(official_paths, out_dir, dec_mask=True, window=256, context=32):
    """Export the fixed-window slice the way `convert inflect --skip-rknn` does; returns its `Exported` record."""
    from rkaudio.families.inflect import FAMILY, export

    job = FAMILY.job(target="rk3588", out=out_dir, options={"window": window, "context": context, "dec_mask": dec_mask})
    [record] = export(job, official_paths["decode"], official_paths["duration"], say=lambda *_: None)
    return record


@pytest.fixture(scope="session")
def slices(official, tmp_path_factory):
    """{True: masked slice, False: unmasked slice} for one size: their `Exported` records."""
    cfg, paths = official
    out = {}
    for masked in (True, False):
        out[masked] = write_slice(paths, tmp_path_factory.mktemp(f"slice_{cfg.name}_{masked}"), masked)
    return out


@pytest.fixture(scope="session")
def nano_record(nano_official, tmp_path_factory):
    """The `Exported` record of a masked Nano slice of its own model (with its end-to-end golden)."""
    return write_slice(nano_official[1], tmp_path_factory.mktemp("nano_slice"))


@pytest.fixture(scope="session")
def nano_slice(nano_record):
    """A masked Nano slice of its own model (for tests that need one size only)."""
    return nano_record.onnx
