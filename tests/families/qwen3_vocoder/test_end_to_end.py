"""The family's end-to-end golden (board self-test kit): the stateful stream over onnxruntime, first B=16 then
B=64 twice with the cache carried on, declared by the family's export and equal to the runtime's stream_decode."""
from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
import torch

from rkaudio.engine import goldens
from rkaudio.families.qwen3_vocoder import export, with_end_to_end
from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG
from rkaudio.pipeline.pipeline import Exported
from rkaudio.core.contract import contract_of, get_contract, set_contract
from rkaudio.core.paths import engine_name, reference_path, selfcheck_path
from rkaudio.board.numeric import snr_db
from rkaudio.host.backends import OnnxBackend
from rkaudio.board.golden import EnginePool, run_loop
from rkaudio.board.qwen3_vocoder import stream_decode

MIN_FP32_DB = 100.0


@pytest.fixture(scope="module")
def steps(tmp_path_factory, step_job, tiny_snapshot):
    """first (B=16) and main (B=64) exported by the family's export(), which declares the golden."""
    out = tmp_path_factory.mktemp("e2e")
    first, main = export(step_job, tiny_snapshot, [("first", 16, out / "step_16.onnx"),
                                                   ("main", 64, out / "step_64.onnx")])
    return first, main


@pytest.fixture(scope="module")
def recording(steps):
    [recorded] = goldens.record_end_to_end(list(steps), say=lambda *_: None)
    return recorded


def test_export_declares_the_golden_over_both_steps(steps):
    first, main = steps
    assert first.end_to_end is not None and first.end_to_end == main.end_to_end
    # An `--onnx` build reads the declaration back from beside the ONNX.
    assert Exported.from_onnx(main.onnx, "qwen3-vocoder") == main


def test_first_then_main_twice_with_the_cache_carried_on(recording, steps):
    first, main = steps
    spec, calls = recording.spec, recording.calls
    assert spec["loop"] == "rkaudio.board.qwen3_vocoder:golden_loop" and spec["engines"] == ["step_16.rknn", "step_64.rknn"]
    codes = recording.inputs["codes"]
    assert codes.shape == (TINY_CONFIG["num_quantizers"], 16 + 2 * 64) and codes.dtype == np.int64
    assert 0 <= codes.min() and codes.max() < TINY_CONFIG["codebook_size"]
    assert [name for name, _, _ in calls] == ["step_16.rknn", "step_64.rknn", "step_64.rknn"]
    assert not calls[0][1]["cache_in"].any()  # the stream starts from a zeroed cache
    for (_, _, before), (_, feeds, _) in zip(calls, calls[1:]):
        np.testing.assert_array_equal(feeds["cache_in"], before["cache_out"].reshape(-1))
    np.testing.assert_array_equal(np.concatenate([f["codes"][0] for _, f, _ in calls], axis=1), codes)


def test_loop_equals_stream_decode_and_the_package_decoder(recording, steps, tiny_reference):
    first, main = steps
    codes = recording.inputs["codes"]
    direct, _ = stream_decode(codes, OnnxBackend(main.reference), contract_of(main.onnx),
                              OnnxBackend(first.reference), contract_of(first.onnx))
    np.testing.assert_array_equal(recording.outputs["pcm"], direct)
    samples = get_contract(main.onnx)["samples_per_frame"]
    assert recording.outputs["pcm"].shape == (codes.shape[1] * samples,)
    with torch.no_grad():
        full = tiny_reference(torch.from_numpy(codes)[None])[0, 0].numpy()
    assert snr_db(full, recording.outputs["pcm"]) > MIN_FP32_DB


def test_replay_makes_the_same_calls_whatever_the_backend_returns(recording, steps):
    """The board and a replay double rely on it: the recorded outputs give the recorded pcm back, and
    zeros from every call still make the same three calls."""
    spec = recording.spec
    contracts = [(engine_name(record.onnx), contract_of(record.onnx)) for record in steps]

    def replay(outputs_of):
        backends = {name: goldens.ReplayBackend([outputs_of(o) for n, _, o in recording.calls if n == name],
                                            [{"name": n, "dtype": "float32"} for n in ("codes", "cache_in")],
                                            ["pcm", "cache_out"]) for name, _ in contracts}
        with EnginePool(contracts, backends.__getitem__) as pool:
            outputs = run_loop(spec["loop"], pool.engines, recording.inputs, spec["params"])
        return outputs, backends

    outputs, backends = replay(lambda o: o)
    np.testing.assert_array_equal(outputs["pcm"], recording.outputs["pcm"])
    assert all(not b._outputs for b in backends.values())  # every recorded call made, none more (it would raise)
    zeros, backends = replay(lambda o: {k: np.zeros_like(v) for k, v in o.items()})
    assert all(not b._outputs for b in backends.values()) and not zeros["pcm"].any()


def test_a_lone_step_runs_two_groups_and_the_window_role_is_left_out(steps, tmp_path):
    """`convert qwen3-vocoder` exports one step: its golden is two groups on it; a window engine has none."""
    _, main = steps
    lone = _copy(main, tmp_path)
    window = tmp_path / "window.onnx"
    onnx.save(set_contract(onnx.load(str(lone.onnx)), {**get_contract(lone.onnx), "role": "window"}), str(window))
    declared_main, declared_window = with_end_to_end([lone, Exported(window, lone.selfcheck)],
                                                     TINY_CONFIG["codebook_size"], say=lambda *_: None)
    assert declared_window.end_to_end is None and declared_main.end_to_end.name == "qwen3_vocoder_stream_main64.e2e.json"
    [recorded] = goldens.record_end_to_end([declared_main], say=lambda *_: None)
    assert recorded.inputs["codes"].shape[1] == 128
    assert [name for name, _, _ in recorded.calls] == ["step_64.rknn", "step_64.rknn"]
    direct, _ = stream_decode(recorded.inputs["codes"], OnnxBackend(lone.reference), contract_of(lone.onnx))
    np.testing.assert_array_equal(recorded.outputs["pcm"], direct)


def _copy(record: Exported, directory) -> Exported:
    for path in (record.onnx, reference_path(record.onnx), selfcheck_path(record.onnx)):
        shutil.copy2(path, directory / path.name)
    return Exported.from_onnx(directory / record.onnx.name, "qwen3-vocoder")
