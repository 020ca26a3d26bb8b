"""Kokoro generator: its own folds (Snake alphas, the resblock mean) exact, the module against kokoro's own
Generator, padded-window exactness, export gate, the field-limit refusal, and the sine gate failing on a bad form
(the surgery passes it applies are tested alone in tests/surgery/)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rkaudio.families.kokoro.export import export
from rkaudio.families.kokoro.graph import (CONTEXT, INPUTS, build_module, check_frames, float64, interior, prepare,
                                              run_torch, window_inputs)
from rkaudio.families.kokoro.verdicts import (MIN_REFERENCE_DB, RANDOM_WINDOW_EXPORT_DB, export_verdict,
                                                 onnx_outputs, padded_verdict, reference_verdict)
from rkaudio.families.kokoro.generator import KokoroGenerator, load_reference_state
from rkaudio.families.kokoro.reference import reference_spec_phase
from rkaudio.core.errors import SetupError
from rkaudio.board.numeric import snr_db
from rkaudio.surgery.modules.snake import reduce_snake_sine
from rkaudio.families.kokoro.ada_snake import fold_snake_alpha
from rkaudio.surgery.graph.round_shift import fp16_round_shift
from rkaudio.surgery.modules.weight_norm import fold_weight_norm

from tests.kokoro_small import SMALL, small_job, small_reference

FRAMES = 64  # 28 context frames per side + 8 emitted


@pytest.fixture(scope="module")
def weights():
    """A small random-init kokoro Generator (weight norm in) with non-trivial alphas and gains."""
    return small_reference()


@pytest.fixture(scope="module")
def module(weights):
    return build_module(SMALL, weights[1])


def test_alpha_fold_is_exact(module):
    feeds = window_inputs(SMALL, FRAMES, seed=5)
    plain = run_torch(prepare(module, "exact", snake_fold=False), feeds)
    folded = run_torch(prepare(module, "exact", snake_fold=True), feeds)
    assert snr_db(plain, folded) > 110


def test_resblock_mean_fold_is_exact_in_float64(module):
    from rkaudio.families.kokoro.generator import fold_resblock_mean

    feeds = window_inputs(SMALL, FRAMES, seed=6)
    plain = float64(module)
    folded = fold_resblock_mean(plain)
    assert folded.mean_folded and not plain.mean_folded
    assert snr_db(run_torch(plain, feeds), run_torch(folded, feeds)) > 250


def test_module_matches_kokoro_generator(weights, module):
    verdict = reference_verdict(SMALL, weights[1], module, FRAMES)
    assert verdict.passed, verdict.line()


def test_module_loads_plain_weights_like_an_onnx_export(weights, module):
    """The ONNX loaders hand over folded weights (no weight_g/weight_v): same module, same output."""
    plain_state = fold_weight_norm(module).state_dict()
    reference_keyed = {}
    for key, value in weights[1].items():
        if key.endswith("weight_g"):
            continue
        if key.endswith("weight_v"):
            key = key[: -len("weight_v")] + "weight"
        reference_keyed[key] = value
    from rkaudio.families.kokoro.generator import state_dict_key

    for key in reference_keyed:
        if key.endswith(".weight") and state_dict_key(key) in plain_state:
            reference_keyed[key] = plain_state[state_dict_key(key)]
    rebuilt = build_module(SMALL, reference_keyed)
    feeds = window_inputs(SMALL, FRAMES, seed=6)
    assert snr_db(run_torch(module, feeds), run_torch(rebuilt, feeds)) == math.inf


@pytest.mark.parametrize("form", ["round", "clip"])
def test_padded_window_matches_unpadded(module, form):
    graph = prepare(module, form, snake_fold=True)
    verdict = padded_verdict(SMALL, graph, FRAMES, 21)
    assert verdict.passed, verdict.line()


def test_padded_gate_fails_without_masks(module):
    """Known-bad artifact: the original InstanceNorm ignores the mask, so padding leaks into the statistics."""
    graph = reduce_snake_sine(module, "round")  # mask_instance_norm not applied
    verdict = padded_verdict(SMALL, graph, FRAMES, 21)
    assert not verdict.passed


def test_reference_gate_fails_on_wrong_sine(weights, module):
    """Known-bad artifact: the clipped sine is far from the exact generator."""
    bad = reduce_snake_sine(module, "clip")
    feeds = window_inputs(SMALL, FRAMES, seed=1)
    ref = reference_spec_phase(weights[0], *(torch.from_numpy(feeds[n]) for n in ("x", "style", "har"))).numpy()
    value = snr_db(interior(SMALL, FRAMES, ref), interior(SMALL, FRAMES, run_torch(bad, feeds)))
    assert value < MIN_REFERENCE_DB


def test_export_gate_and_engine_graph(tmp_path, weights):
    import onnx

    from rkaudio.pipeline.pipeline import Exported

    [record] = export(small_job(tmp_path), SMALL, weights[1], "random", "round")
    engine, reference, verdicts = record.onnx, record.reference, record.verdicts
    assert all(v.passed for v in verdicts), [v.line() for v in verdicts]
    # The recipe's verdict set; the fp32 twin and the verdicts travel in the contract for `--onnx`.
    assert [v.name for v in verdicts] == ["onnx_vs_torch", "padded_vs_unpadded", "walk_vs_windows"]
    assert reference == tmp_path / f"kokoro_generator_w{FRAMES}.fp32.onnx"
    assert Exported.from_onnx(engine, "kokoro") == record
    model = onnx.load(str(engine))
    ops = {node.op_type for node in model.graph.node}
    assert not ops & {"Sin", "Floor", "Round", "Cast", "ReduceL2", "InstanceNormalization", "ReduceSum"}, ops
    assert "GlobalAveragePool" in ops
    assert [i.name for i in model.graph.input] == list(INPUTS)
    from rkaudio.core.contract import contract_of
    from rkaudio.board.window_walk import WindowSpan

    contract = contract_of(model)
    assert contract.exec_params == {"overlap": 0, "gain": False}
    assert WindowSpan.of(contract).emitted == FRAMES - 2 * CONTEXT
    # The engine graph differs from its fp32 twin only in the rounding shift.
    with pytest.raises(ValueError):
        fp16_round_shift(model)
    feeds = dict(np.load(engine.with_suffix(".selfcheck.npz")))
    assert snr_db(onnx_outputs(reference, feeds), onnx_outputs(engine, feeds)) < 20


def test_convert_export_adds_the_reference_gate_and_a_clip_engine_is_its_own_fp32_reference(tmp_path, weights):
    """`convert kokoro`'s verdict set (the recipe's plus the kokoro Generator gate); without the fp16 rounding
    shift the engine graph needs no twin."""
    [record] = export(small_job(tmp_path), SMALL, weights[1], "random", "clip", reference_gate=True)
    assert [v.name for v in record.verdicts] == ["onnx_vs_torch", "generator_vs_kokoro_reference",
                                                 "padded_vs_unpadded", "walk_vs_windows"]
    assert all(v.passed for v in record.verdicts), [v.line() for v in record.verdicts]
    assert record.reference is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"kokoro_generator_w{FRAMES}.onnx",
                                                          f"kokoro_generator_w{FRAMES}.selfcheck.npz",
                                                          f"kokoro_walk_w{FRAMES}.e2e.json",
                                                          f"kokoro_walk_w{FRAMES}.e2e.npz"]


def test_end_to_end_golden_is_two_walk_windows_of_the_utterance_through_the_runtime_walk(tmp_path, weights):
    """The export declares the golden (rkaudio.board.kokoro:golden_loop at the contract's exec params, gain off);
    recorded over onnxruntime fp32 on the twin it is exactly `walk` + the iSTFT head, in 2 engine calls, and
    the first call's inputs are the engine's self-check arrays (one copy in the kit)."""
    import json

    from rkaudio.families.kokoro.export import golden_frames
    from rkaudio.engine.goldens import record_end_to_end
    from rkaudio.core.contract import contract_of
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.board.kokoro import KokoroFields, KokoroWindow, golden_loop, spec_phase_to_audio, walk

    [record] = export(small_job(tmp_path), SMALL, weights[1], "random", "round")
    spec = json.loads(record.end_to_end.read_text())
    assert (spec["loop"], spec["params"], spec["engines"]) == (
        "rkaudio.board.kokoro:golden_loop", {"overlap": 0, "gain": False}, [f"kokoro_generator_w{FRAMES}.rknn"])
    [recording] = record_end_to_end([record], say=lambda line: None)
    x, har, style = (recording.inputs[name] for name in ("x", "har", "style"))
    assert x.shape[-1] == golden_frames(FRAMES) == FRAMES + 8 and har.shape[-1] == 60 * x.shape[-1] + 1
    assert [name for name, _, _ in recording.calls] == [f"kokoro_generator_w{FRAMES}.rknn"] * 2
    selfcheck = dict(np.load(record.selfcheck))
    first_feeds = recording.calls[0][1]
    assert sorted(first_feeds) == sorted(selfcheck)
    for name, value in selfcheck.items():
        np.testing.assert_array_equal(first_feeds[name], value)

    contract = contract_of(record.onnx)
    walked = walk(OnnxBackend(record.reference), x, har, style, KokoroWindow.from_contract(contract))
    fields = KokoroFields.of(contract)
    audio = spec_phase_to_audio(walked, fields.n_fft, fields.istft_hop)
    assert recording.outputs["audio"].dtype == np.float32 and recording.outputs["audio"].shape == (300 * x.shape[-1],)
    np.testing.assert_array_equal(recording.outputs["audio"], audio.astype(np.float32))

    class Engine:  # the loop refuses gain (a board has no full-length CPU decode to match)
        contract = contract_of(record.onnx)
    with pytest.raises(ValueError, match="gain"):
        golden_loop([Engine()], recording.inputs, {"gain": True})

def test_frames_past_the_field_limit_are_refused():
    assert check_frames(136) == 136
    with pytest.raises(SetupError, match="8192"):
        check_frames(137)
    with pytest.raises(SetupError, match="13-bit"):
        check_frames(512)


LAYER_TABLE_HEAD = ("ID   OpType             DataType Target InputShape                               OutputShape"
                    "            Cycles(DDR/NPU/Total)    RW(KB)       FullName")


def layer_table_log(late_reshape_name: str) -> str:
    """A layer table (rows as the rk3588 Kokoro build logged them) where the compiler scheduled the `har` input's
    rank-adapting Reshape after NPU layers, under the given node name."""
    rows = ["0    InputOperator      FLOAT16  CPU    \\                                        (1,22,7681)"
            "            0/0/0                    0            InputOperator:har",
            "1    Conv               FLOAT16  NPU    (1,512,1,128),(2560,512,1,2),(2560)      (1,2560,1,129)"
            "         255546/737280/737280     5258         Conv:/ups.0/conv/Conv",
            f"2    Reshape            FLOAT16  CPU    (1,22,7681),(4)                          (1,22,1,7681)"
            f"          0/0/0                    330          Reshape:{late_reshape_name}",
            "3    Conv               FLOAT16  NPU    (1,22,1,7681),(256,22,1,12),(256)        (1,256,1,1280)"
            "         51648/245760/245760      553          Conv:/noise_convs.0/Conv"]
    lines = ["-" * 40, LAYER_TABLE_HEAD, "-" * 40, *rows, "-" * 40]
    return "\n".join(f"D RKNN: [05:10:32.841] {line}" for line in lines)


def test_cpu_ops_gate_counts_a_late_input_reshape_as_glue_only_for_an_input():
    """`har_rs` is the har input's own Reshape (glue); the same row under another node's name is CPU compute."""
    from rkaudio.gates.layer_table import cpu_ops_verdict, parse_layer_table

    assert cpu_ops_verdict(parse_layer_table(layer_table_log("har_rs"))).passed
    inside = parse_layer_table(layer_table_log("/noise_convs.0/Mul_rs"))
    assert not cpu_ops_verdict(inside).passed
    assert [op["type"] for op in inside.ops_json()["cpu_ops"]] == ["Reshape"]


def test_onnx_vs_torch_gate_fails_on_an_export_that_drifted_from_its_torch_graph(tmp_path, weights, module):
    import copy

    import onnx
    from onnx import numpy_helper

    [record] = export(small_job(tmp_path), SMALL, weights[1], "random", "round")
    reference = record.reference
    graph = prepare(copy.deepcopy(module), "round", True)
    feeds = dict(np.load(tmp_path / f"kokoro_generator_w{FRAMES}.selfcheck.npz"))
    assert export_verdict(graph, reference, feeds, "round").passed
    # A known-bad export: one weight tensor off by 0.1%, as a stale or mis-traced graph would be.
    model = onnx.load(str(reference))
    largest = max(model.graph.initializer, key=lambda init: int(np.prod(init.dims)))
    largest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(largest) * 1.001, largest.name))
    tampered = tmp_path / "tampered.onnx"
    onnx.save(model, str(tampered))
    verdict = export_verdict(graph, tampered, feeds, "round")
    assert not verdict.passed and verdict.value < RANDOM_WINDOW_EXPORT_DB
