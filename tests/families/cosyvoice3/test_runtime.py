"""rkaudio.board.cosyvoice3: rung choice, refusal past the largest, padding/crop, B=1 vs B=2 CFG, the golden loop."""
from __future__ import annotations

import ast

import numpy as np
import pytest

from rkaudio.core.contract import contract_of, get_contract
from rkaudio.core.paths import REPO_ROOT
from rkaudio.board import cosyvoice3 as flow_ladder
from rkaudio.board.cosyvoice3 import FlowFields, FlowLadder, FlowLengthError


class Counting:
    def __init__(self, backend):
        self.backend, self.calls = backend, 0

    def run(self, feeds):
        self.calls += 1
        return self.backend.run(feeds)


@pytest.fixture(scope="module")
def ladder(tiny_export):
    from rkaudio.host.backends import OnnxBackend

    rungs = {get_contract(r.onnx)["length"]: Counting(OnnxBackend(r.onnx)) for r in tiny_export}
    return FlowLadder(rungs, FlowFields.of(contract_of(tiny_export[0].onnx)))


def test_smallest_rung_that_fits_and_refusal_past_the_largest(ladder):
    assert [ladder.rung_for(n) for n in (1, 24, 25, 32)] == [24, 24, 32, 32]
    with pytest.raises(FlowLengthError, match=r"33 frames exceeds the largest estimator rung \(S=32"):
        ladder.rung_for(33)


def test_solve_makes_two_calls_per_step_on_the_right_rung(ladder, tiny_model):
    from rkaudio.families.cosyvoice3.export import ode_inputs

    inputs = ode_inputs(tiny_model.mel_dim, tiny_model.input_embed.spk_dim, 28, seed=4)
    before = {length: rung.calls for length, rung in ladder.rungs.items()}
    mel = ladder.solve(inputs["noise"], inputs["mu"], inputs["spks"], inputs["cond"])
    assert mel.shape == (1, 80, 28) and np.all(np.isfinite(mel))
    assert ladder.rungs[32].calls - before[32] == 20 and ladder.rungs[24].calls == before[24]


def test_b2_engine_gives_the_b1_result(tmp_path, tiny_model, ladder):
    """CFG in one B=2 call equals two B=1 calls (the runtime reads the scheme from the contract)."""
    import onnx

    from rkaudio.families.cosyvoice3.export import export_onnx, flow_fields, ode_inputs
    from rkaudio.families.cosyvoice3.snapshot import DEFAULT_CFM
    from rkaudio.board.numeric import snr_db
    from rkaudio.host.backends import OnnxBackend

    path = tmp_path / "s24_b2.onnx"
    graph = export_onnx(tiny_model, 24, path, batch=2)
    assert [d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim] == [2, 80, 24]
    counting = Counting(OnnxBackend(path))
    b2 = FlowLadder({24: counting}, flow_fields(tiny_model, DEFAULT_CFM, 2))
    inputs = ode_inputs(tiny_model.mel_dim, tiny_model.input_embed.spk_dim, 20, seed=6)
    args = (inputs["noise"], inputs["mu"], inputs["spks"], inputs["cond"])
    assert snr_db(ladder.solve(*args), b2.solve(*args)) > 110 and counting.calls == 10
    assert onnx.load(str(path)).graph.input[7].name == "rope_sin"


def test_tables_and_schedule_match_upstream(tiny_model):
    import torch

    from rkaudio.families.cosyvoice3.dit import SinusPositionEmbedding, apply_rotary_pos_emb
    from rkaudio.families.cosyvoice3.export import time_freqs
    from rkaudio.families.cosyvoice3.reference import cosine_t_span

    assert np.allclose(flow_ladder.cosine_schedule(10), cosine_t_span(10).numpy(), atol=1e-15, rtol=0)
    t = torch.tensor([0.0, 0.37, 1.0], dtype=torch.float64)
    upstream = SinusPositionEmbedding(256)(t).numpy()
    assert np.abs(flow_ladder.time_sinusoid(t.numpy(), time_freqs(), 1000.0) - upstream).max() < 1e-6
    heads, dim_head = tiny_model.heads, tiny_model.dim_head
    q = torch.randn(1, 9, heads * dim_head, dtype=torch.float64)
    freqs, _ = tiny_model.double().rotary_embed.forward_from_seq_len(9)
    tiny_model.float()
    want = apply_rotary_pos_emb(q, freqs).numpy().reshape(9, heads, dim_head).transpose(1, 0, 2)
    cos, sin = flow_ladder.rope_tables(9, tiny_model.rotary_embed.inv_freq.numpy(), heads, dim_head)
    from rkaudio.families.cosyvoice3.engine_graph import rotate_half_matrix

    qh = q.numpy().reshape(9, heads, dim_head).transpose(1, 0, 2)
    got = qh * cos + (qh @ rotate_half_matrix(dim_head)) * sin
    assert np.abs(got - want).max() < 1e-6


def test_golden_loop_is_the_ladder_solve(tiny_export):
    """The declared golden, recorded over onnxruntime, is the runtime's solve: 20 calls on the S=24 rung."""
    from rkaudio.engine import goldens
    from rkaudio.host.backends import OnnxBackend

    [recording] = goldens.record_end_to_end(tiny_export, say=lambda _: None)
    assert len(recording.calls) == 20 and {name for name, _, _ in recording.calls} == {"cosyvoice3_flow_s24.rknn"}
    inputs = recording.inputs
    direct = FlowLadder({24: OnnxBackend(tiny_export[0].onnx)}, FlowFields.of(contract_of(tiny_export[0].onnx))).solve(
        inputs["noise"], inputs["mu"], inputs["spks"], inputs["cond"])
    assert np.array_equal(recording.outputs["mel"], direct)


def test_runtime_module_is_python38_and_numpy_only():
    path = REPO_ROOT / "rkaudio" / "board" / "cosyvoice3.py"
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    top = {alias.name.split(".")[0] for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
           for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
    assert top <= {"__future__", "dataclasses", "math", "typing", "numpy", "rkaudio"}, top
