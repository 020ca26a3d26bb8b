"""The encoder's end-to-end golden: one real token sequence per width (that width's self-check sequence),
through the runtime's width ladder (rkaudio.board.ladder.golden_loop), recorded call by call on onnxruntime fp32."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rkaudio.engine import goldens
from rkaudio.families.piper import encoder
from rkaudio.core.paths import engine_name
from rkaudio.board.numeric import snr_db
from rkaudio.host.backends import OnnxBackend
from rkaudio.board.ladder import WidthLadder
from tests.real_checkpoints import real_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
@real_checkpoint
def ladder_export(tmp_path_factory):
    from rkaudio.families.piper import FAMILY

    out = tmp_path_factory.mktemp("encoder_ladder")
    return encoder.export(FAMILY.job("duration_encoder", target="rk3588", out=out, options={"frames": [48, 32]},
                                     gates={"max_drift_pct": None}))


def test_golden_runs_each_width_once_on_its_self_check_sequence(ladder_export):
    spec = json.loads(ladder_export[0].end_to_end.read_text())
    assert spec["loop"] == "rkaudio.board.ladder:golden_loop" and spec["params"] == {"width_key": "frames", "axis": -1}
    assert all(r.end_to_end == ladder_export[0].end_to_end for r in ladder_export)
    (recording,) = goldens.record_end_to_end(ladder_export)
    assert sorted(recording.inputs) == ["x_emb@0", "x_emb@1", "x_mask@0", "x_mask@1"]
    assert [recording.inputs[f"x_mask@{k}"].shape for k in (0, 1)] == [(1, 1, 29), (1, 1, 45)]
    assert [name for name, _, _ in recording.calls] == [engine_name(r.onnx) for r in ladder_export]
    for record, (_, feeds, outputs) in zip(ladder_export, recording.calls):
        with np.load(record.selfcheck) as selfcheck:  # the call is the engine's own self-check: one array each
            assert sorted(feeds) == sorted(selfcheck.files)
            assert all(np.array_equal(feeds[name], selfcheck[name]) for name in selfcheck.files)
        reference = OnnxBackend(record.onnx).run(feeds)
        assert all(np.array_equal(outputs[name], reference[name]) for name in reference)
    voice = encoder.Voice(None)
    exact = OnnxBackend(voice.dynamic)
    for k, width in enumerate((32, 48)):
        feeds = {name: recording.inputs[f"{name}@{k}"] for name in ("x_emb", "x_mask")}
        assert feeds["x_mask"].shape[-1] == width - 3 and feeds["x_mask"].min() == 1.0  # real tokens only
        reference = exact.run(feeds)  # the voice's own encoder at the exact length
        for name in ("stats", "dp_cond"):
            assert recording.outputs[f"{name}@{k}"].shape == reference[name].shape
            assert snr_db(reference[name], recording.outputs[f"{name}@{k}"]) >= encoder.MIN_PADDED_DB


def test_golden_loop_is_the_runtime_ladder(ladder_export):
    (recording,) = goldens.record_end_to_end(ladder_export)
    ladder = WidthLadder({int(w): OnnxBackend(r.onnx) for w, r in zip((48, 32), ladder_export[::-1])})
    for k in (0, 1):
        feeds = {name: recording.inputs[f"{name}@{k}"] for name in ("x_emb", "x_mask")}
        direct = ladder.run(feeds, feeds["x_mask"].shape[-1])
        assert all(np.array_equal(direct[name], recording.outputs[f"{name}@{k}"]) for name in direct)
