"""Inflect's tail and interior gates follow decode.onnx's own fp32 floor (rkaudio.gates.fp32_floor) where it is under
their bars: the random Nano with a flow offset (tests/low_floor.offset_flow; its floor 131.2 -> 85.8 dB) exports
with every gate passing, its interior window at 115.8 dB, under the old fixed 120 dB; the planted faults of
test_gates (the decoder mask one frame off) and test_slice (no context) still fail on the same weights."""
from __future__ import annotations

import shutil

import onnx
import pytest

from rkaudio.families.inflect import MIN_INTERIOR_DB, MIN_TAIL_DB
from rkaudio.families.inflect.decoder import TAIL_LENGTHS, selfcheck_verdicts
from tests.families.inflect.test_gates import shifted_decoder_mask
from tests.families.inflect.test_slice import _tampered
from tests.low_floor import offset_flow

OFFSET = 3e4
COUPLINGS = ("flows.3", "flows.2", "flows.1")  # the reverse flow runs 3, 2, 1, 0
TAILS = [f"tail_snr[{n}]" for n in TAIL_LENGTHS]


@pytest.fixture(scope="module")
def low_floor_official(nano_official, tmp_path_factory):
    """The Nano official files with decode.onnx offset (duration.onnx and config.json as they are)."""
    _, paths = nano_official
    out = tmp_path_factory.mktemp("low_floor_nano")
    copied = {}
    for name, path in paths.items():
        target = out / path.relative_to(paths["decode"].parent.parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
        copied[name] = target
    onnx.save(offset_flow(onnx.load(str(paths["decode"])), OFFSET, COUPLINGS), str(copied["decode"]))
    return copied


def _export(paths, out_dir):
    from rkaudio.families.inflect import FAMILY, export

    [record] = export(FAMILY.job(target="rk3588", out=out_dir), paths["decode"], paths["duration"],
                      say=lambda *_: None)
    return record


def test_low_floor_decode_exports_with_its_gates_held_to_the_floor(low_floor_official, tmp_path):
    record = _export(low_floor_official, tmp_path)
    print("\n" + "\n".join(v.line() for v in record.verdicts))
    assert all(v.passed for v in record.verdicts), [v.line() for v in record.verdicts]
    gated = {v.name: v for v in record.verdicts if v.name in [*TAILS, "interior_snr_min"]}
    assert len(gated) == 5
    assert all(v.threshold < MIN_TAIL_DB - 5 for v in gated.values()), [v.line() for v in gated.values()]
    interior = gated["interior_snr_min"]
    assert interior.value < MIN_INTERIOR_DB, interior.line()  # the old fixed bar refused this faithful export


def test_planted_faults_still_fail_on_the_low_floor_decode(low_floor_official, tmp_path, monkeypatch):
    exported = _export(low_floor_official, tmp_path / "real")
    no_context = _tampered(exported.onnx, tmp_path, context=0, emitted=256)
    verdicts = selfcheck_verdicts(no_context, low_floor_official["decode"], low_floor_official["duration"],
                                  say=lambda *_: None)
    [interior] = [v for v in verdicts if not v.passed]
    assert interior.name == "interior_snr_min" and interior.value < interior.threshold - 20, interior.line()
    monkeypatch.setattr("rkaudio.surgery.graph.mask.mask_decoder", shifted_decoder_mask(1))
    planted = _export(low_floor_official, tmp_path / "planted")
    failed = [v for v in planted.verdicts if not v.passed]
    assert [v.name for v in failed] == TAILS, [v.line() for v in planted.verdicts]
    assert all(v.value < v.threshold - 40 for v in failed), [v.line() for v in failed]
