"""A rung split by depth into engines chained through `hidden`: same gates, the same ODE as the whole rung, the
contract naming the chain, the exec_plan ladder in (length, part) order, and the golden loop over the parts."""
from __future__ import annotations

import numpy as np
import pytest

from rkaudio.core.contract import contract_of, get_contract
from rkaudio.board.cosyvoice3 import Chain, FlowFields, FlowLadder


@pytest.fixture(scope="module")
def split_export(tmp_path_factory, flow_job, tiny_model):
    """The S=24 rung split in 2, S=32 whole (the two kinds in one ladder)."""
    from rkaudio.families.cosyvoice3.export import export
    from rkaudio.families.cosyvoice3.snapshot import DEFAULT_CFM

    job = flow_job(tmp_path_factory.mktemp("cosyvoice3_split"), parts={"24": 2})
    return export(job, tiny_model, DEFAULT_CFM, say=lambda _: None)


def test_split_blocks_are_contiguous_and_cover_the_depth():
    from rkaudio.families.cosyvoice3.engine_graph import split_blocks

    assert split_blocks(22, 2) == [(0, 11), (11, 22)] and split_blocks(22, 3) == [(0, 8), (8, 15), (15, 22)]
    assert split_blocks(2, 1) == [(0, 2)]
    with pytest.raises(ValueError):
        split_blocks(2, 3)


def test_split_rung_passes_the_rung_gates(split_export):
    names = [r.onnx.name for r in split_export]
    assert names == ["cosyvoice3_flow_s24_p1of2.onnx", "cosyvoice3_flow_s24_p2of2.onnx", "cosyvoice3_flow_s32.onnx"]
    verdicts = {v.name: v for record in split_export for v in record.verdicts}
    assert verdicts["export_snr[S=24]"].value >= 100 and verdicts["padding_exact[S=24]"].value >= 100
    assert verdicts["ode_snr"].value >= 80 and verdicts["forbidden_ops[S=24 part 2]"].passed
    assert all(v.passed for v in verdicts.values())


def test_contract_names_the_chain_and_the_ladder_order(split_export):
    from rkaudio.release.package import merge_exec_plan
    from rkaudio.core.paths import engine_name

    first, second, whole = (get_contract(r.onnx) for r in split_export)
    assert first["chain"]["part"] == 0 and first["chain"]["parts"] == 2 and first["chain"]["blocks"] == [0, 1]
    assert [e["name"] for e in first["io"]["outputs"]] == ["hidden"] and first["io"]["outputs"][0]["shape"] == [1, 24, 64]
    assert [e["name"] for e in second["io"]["inputs"]] == ["hidden", "mask", "t_freq", "rope_cos", "rope_sin"]
    assert second["io"]["outputs"] == [{"name": "dphi_dt", "shape": [1, 80, 24]}] and "chain" not in whole
    plan = merge_exec_plan([(engine_name(r.onnx), contract_of(r.onnx)) for r in reversed(split_export)])
    assert plan["cosyvoice3.exec_plan"]["flow"] == {"impl": "rknn", "artifacts": {"main": ",".join([
        "cosyvoice3_flow_s24_p1of2.rknn", "cosyvoice3_flow_s24_p2of2.rknn", "cosyvoice3_flow_s32.rknn"])}}


def test_chain_solve_equals_the_whole_rung(split_export, tiny_export, tiny_model):
    from rkaudio.families.cosyvoice3.export import ode_inputs
    from rkaudio.board.numeric import snr_db
    from rkaudio.host.backends import OnnxBackend

    flow = FlowFields.of(contract_of(tiny_export[0].onnx))
    whole = FlowLadder({24: OnnxBackend(tiny_export[0].onnx)}, flow)
    chained = FlowLadder({24: [OnnxBackend(split_export[0].onnx), OnnxBackend(split_export[1].onnx)]}, flow)
    assert isinstance(chained.rungs[24], Chain)
    inputs = ode_inputs(tiny_model.mel_dim, tiny_model.input_embed.spk_dim, 20, seed=3)
    args = (inputs["noise"], inputs["mu"], inputs["spks"], inputs["cond"])
    assert snr_db(whole.solve(*args), chained.solve(*args)) > 110


def test_golden_loop_runs_the_parts_in_order(split_export):
    from rkaudio.engine import goldens
    from rkaudio.board import cosyvoice3 as flow_ladder

    [recording] = goldens.record_end_to_end(split_export, say=lambda _: None)
    engines = [name for name, _, _ in recording.calls]
    assert len(engines) == 40 and engines[:2] == ["cosyvoice3_flow_s24_p1of2.rknn", "cosyvoice3_flow_s24_p2of2.rknn"]
    assert flow_ladder.calls_per_solve(contract_of(split_export[0].onnx)) == 40


def test_an_incomplete_chain_is_refused(split_export):
    class Fake:
        def __init__(self, contract):
            self.contract = contract

    with pytest.raises(ValueError, match="incomplete chain"):
        FlowLadder.from_engines([Fake(contract_of(split_export[1].onnx))])


def test_check_renders_through_the_chain(check_cli, split_export, tmp_path):
    """`convert check cosyvoice3` on a split rung runs its parts in order (here onnxruntime, every tensor rounded to
    fp16)."""
    onnx = [arg for record in split_export for arg in ("--onnx", str(record.onnx))]
    result = check_cli(*onnx, "--frames", "20", "--steps", "2", "--out", str(tmp_path / "chain.npy"))
    assert result.exit_code == 0, result.output
    assert "20 frames on the S=24 rung in 2 parts, 2-step ODE (onnxruntime, every tensor rounded to fp16" in result.output
    assert np.load(tmp_path / "chain.npy").shape == (80, 20)
