"""The fixed-S export and its gates, each shown failing on a known-bad graph."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

from rkaudio.families.cosyvoice3 import export as E
from rkaudio.board.cosyvoice3 import FlowFields
from rkaudio.core.contract import contract_of, get_contract
TINY_LENGTHS = [24, 32]  # the rungs of the tiny_export fixture (conftest.py)


def verdicts_of(records) -> dict:
    return {v.name: v for record in records for v in record.verdicts}


def test_every_export_gate_passes_with_its_figure(tiny_export):
    verdicts = verdicts_of(tiny_export)
    for length in TINY_LENGTHS:
        assert verdicts[f"export_snr[S={length}]"].value >= 100
        assert verdicts[f"padding_exact[S={length}]"].value >= 100
        assert verdicts[f"mask_one_detected[S={length}]"].value < 60
        assert verdicts[f"forbidden_ops[S={length}]"].value == 0
    assert verdicts["ode_snr"].value >= 80
    assert all(v.passed for v in verdicts.values()), [v.line() for v in verdicts.values() if not v.passed]
    print({name: round(v.value, 1) for name, v in verdicts.items()})


def test_graph_has_no_isnan_not_neg_tile_or_inf(tiny_export):
    from rkaudio.gates import opscan

    for record in tiny_export:
        model = onnx.load(str(record.onnx))
        ops = {node.op_type for node in model.graph.node}
        assert not ops & set(E.FORBIDDEN_OPS), ops
        assert E.forbidden(model) == [] and opscan.scan(model, "rk3588") == []


def test_plain_export_of_the_reference_is_refused(tmp_path, tiny_model):
    """What a plain fixed-S export of upstream's forward holds (the issue's finding): the gate names it."""
    import warnings

    import torch

    from rkaudio.surgery.graph.fold import fold_fixed

    length = 16
    args = (torch.randn(1, 80, length), torch.ones(1, 1, length), torch.randn(1, 80, length), torch.tensor([0.3]),
            torch.randn(1, 80), torch.randn(1, 80, length))
    path = tmp_path / "plain.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(tiny_model, args, str(path), input_names=["x", "mask", "mu", "t", "spks", "cond"],
                          output_names=["y"], opset_version=17, dynamo=False)
    plain = fold_fixed(onnx.load(str(path)))
    found = " ".join(E.forbidden(plain))
    for what in ("IsNaN:", "Not:", "Neg:", "Tile:", "non-finite constant"):
        assert what in found
    assert not E.forbidden_verdict(plain, length).passed


def test_contract_holds_rung_cfg_scheme_and_io(tiny_export):
    contract = get_contract(tiny_export[0].onnx)
    assert (contract["family"], contract["component"], contract["role"]) == ("cosyvoice3", "flow", "main")
    assert contract["exec_plan_option"] == "cosyvoice3.exec_plan" and "exec_params" not in contract
    assert contract["length"] == contract["ladder_key"] == 24 and contract["batch"] == 1
    assert contract["cfg"]["rate"] == 0.7 and contract["cfg"]["uncond_zeroed"] == ["mu", "spks", "cond"]
    assert contract["cfg"]["scheme"] == "two B=1 calls per step"
    assert contract["ode"]["steps"] == 10 and contract["ode"]["schedule"] == "cosine"
    inputs = {entry["name"]: entry["shape"] for entry in contract["io"]["inputs"]}
    assert inputs["rope_cos"] == [4, 24, 16] and inputs["t_freq"] == [1, 256]
    assert contract["io"]["outputs"] == [{"name": "dphi_dt", "shape": [1, 80, 24]}]
    graph = onnx.load(str(tiny_export[0].onnx))
    assert [i.name for i in graph.graph.input] == list(inputs)


def test_exec_plan_lists_the_rungs_in_length_order(tiny_export):
    from rkaudio.release.package import merge_exec_plan
    from rkaudio.core.paths import engine_name

    engines = [(engine_name(r.onnx), contract_of(r.onnx)) for r in reversed(tiny_export)]
    plan = merge_exec_plan(engines)
    assert plan == {"cosyvoice3.exec_plan": {"flow": {"impl": "rknn", "artifacts": {
        "main": "cosyvoice3_flow_s24.rknn,cosyvoice3_flow_s32.rknn"}}}}


@pytest.fixture(scope="module")
def unmasked(tmp_path_factory, tiny_model):
    """A graph whose mask is not wired: padding leaks into the real frames."""
    path = tmp_path_factory.mktemp("unmasked") / "s24.onnx"
    E.export_onnx(tiny_model, 24, path, ignore_mask=True)
    return path


def test_padding_gates_fail_when_the_mask_is_not_wired(unmasked, tiny_model, tiny_model64):
    verdicts = {v.name: v for v in E.rung_verdicts(tiny_model, tiny_model64, unmasked, 24, seed=0)}
    assert not verdicts["padding_exact[S=24]"].passed and verdicts["padding_exact[S=24]"].value < 60
    assert not verdicts["mask_one_detected[S=24]"].passed  # mask 1 over the padding changes nothing: caught


def test_mask_one_over_padding_is_caught(tiny_export, tiny_model):
    """Padding marked 1 moves the real frames far below the padding bar (upstream, not only our graph)."""
    from rkaudio.board.numeric import snr_db

    feeds = E.make_inputs(tiny_model, 24, 18, seed=5)
    unpadded = E.reference_call(tiny_model, feeds, 18)
    marked = E.reference_call(tiny_model, dict(feeds, mask=np.ones_like(feeds["mask"])), 24)[..., :18]
    padded = E.reference_call(tiny_model, feeds, 24)[..., :18]
    assert snr_db(unpadded, padded) > 100 > 60 > snr_db(unpadded, marked)


def test_export_snr_fails_on_a_wrong_graph(tmp_path, tiny_model, tiny_model64):
    path = tmp_path / "all_heads.onnx"
    E.export_onnx(tiny_model, 24, path, rotate_all_heads=True)
    verdicts = {v.name: v for v in E.rung_verdicts(tiny_model, tiny_model64, path, 24, seed=0)}
    assert not verdicts["export_snr[S=24]"].passed and verdicts["export_snr[S=24]"].value < 80


def test_ode_gate_fails_on_a_wrong_cfg(tiny_export, tiny_model, tiny_model64):
    flow = FlowFields.of(contract_of(tiny_export[0].onnx))
    inputs = E.ode_inputs(tiny_model.mel_dim, tiny_model.input_embed.spk_dim, 18, seed=2)
    paths = {24: tiny_export[0].onnx}
    assert E.ode_verdict(paths, flow, tiny_model64, inputs).passed
    wrong = dataclasses.replace(flow, cfg={**flow.cfg, "rate": 0.5})
    verdict = E.ode_verdict(paths, wrong, tiny_model64, inputs, cfg_rate=0.7)
    assert not verdict.passed and verdict.value < 60
