"""RMSNorm placement does not hang on the norm weights (issue #14 item 5).

The family exports every RMSNorm as `weight * (x / sqrt(mean(x^2) + eps))` (graphs.rms_norm). With identity
weights (a fresh checkpoint) onnxslim folds the `Mul` by ones away, so the graph differs from a perturbed one;
the tensor-by-tensor `Div` stays on the NPU either way. The reciprocal form `x * rsqrt(...)` (exported as
`Div(1, Sqrt)`, Qwen3-TTS's form) does not: with identity weights the toolkit puts every such Div on the CPU.
Measured on this tiny graph (one layer's step + one head shard, 3 norms), rknn-toolkit2 2.3.2, CPU ops:
  x / sqrt, identity and perturbed weights: rk3588 [Reshape] and [Reshape]; rk3576 [] and []
  rsqrt, identity weights (the control):    rk3588 [Div x3, Reshape];       rk3576 [Div x3]
(2.5.0 gives the x / sqrt counts too; with perturbed weights the rsqrt form keeps its Divs on the NPU.)"""
from __future__ import annotations

from collections import Counter

import onnx
import pytest
import torch

from rkaudio.families.audio8 import graphs
from rkaudio.families.audio8 import model as M


class StepAndHead(torch.nn.Module):
    """One decoder layer's step over a 128-row K/V bucket, then a head shard: the input, post-attention and final
    norms."""

    def __init__(self, decoder):
        super().__init__()
        self.step = graphs.StepGraph(decoder, layers=[0])
        self.head = graphs.HeadShardGraph(decoder, 0, 80)

    def forward(self, hidden, full_k, full_v, cos, sin, mask):
        return self.head(self.step(hidden, cos, sin, mask, full_k, full_v)[0])


def _model(identity: bool):
    model = M.build_random(M.small_config(), seed=0)
    with torch.no_grad():
        for module in model.decoder.modules():
            if type(module).__name__ == "Qwen2RMSNorm":
                module.weight.fill_(1.0) if identity else module.weight.normal_(1.0, 0.1, generator=torch.Generator().manual_seed(1))
    return model


def _export(tmp_path, identity: bool, monkeypatch=None, reciprocal: bool = False):
    from rkaudio.families.audio8.export import _export as export_graph
    from rkaudio.core.contract import make_contract

    if reciprocal:  # the known-bad control: Qwen3's form
        monkeypatch.setattr(graphs, "rms_norm", lambda norm, x: norm.weight * (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)))
    args = (torch.zeros(1, 1, 64), torch.zeros(4, 128, 16), torch.zeros(4, 128, 16), torch.ones(1, 16),
            torch.zeros(1, 16), torch.zeros(4, 1, 128))
    path = tmp_path / f"norms_{'identity' if identity else 'perturbed'}{'_rsqrt' if reciprocal else ''}.onnx"
    export_graph(StepAndHead(_model(identity).decoder), args, ["hidden", "full_k", "full_v", "cos", "sin", "mask"],
                 ["logits"], make_contract("audio8", "decoder", "norms", "audio8_asr.exec_plan"), path)
    return path


def _reciprocals(model: onnx.ModelProto) -> list[str]:
    """Div nodes whose numerator is a constant (a reciprocal root, 1 / sqrt)."""
    from rkaudio.core.onnx_graph import constant_values

    constants = constant_values(model.graph)
    return [node.name for node in model.graph.node if node.op_type == "Div" and node.input[0] in constants]


def test_exported_graphs_hold_no_reciprocal_root(small_plan):
    """Cheap guard on every graph of the small plan: norms divide x by sqrt, never form 1 / sqrt."""
    for path in sorted(small_plan.glob("*.onnx")):
        model = onnx.load(str(path))
        assert not _reciprocals(model), (path.name, _reciprocals(model))


def test_identity_weights_only_drop_the_weight_multiply(tmp_path):
    identity, perturbed = (onnx.load(str(_export(tmp_path, flag))) for flag in (True, False))
    ops = [Counter(node.op_type for node in model.graph.node) for model in (identity, perturbed)]
    assert ops[1] - ops[0] == Counter({"Mul": 3}) and not ops[0] - ops[1]  # the three norm weights
    assert ops[0]["Div"] == ops[1]["Div"] == 3 and not _reciprocals(identity)


@pytest.mark.parametrize("target", ["rk3588", "rk3576"])
def test_identity_and_perturbed_norm_weights_compile_to_the_same_cpu_ops(tmp_path, target, require_converter,
                                                                          monkeypatch):
    from rkaudio.engine.build import BuildOptions, build_engine

    require_converter("2.3.2")

    def cpu_ops(path):
        manifest = build_engine(path, tmp_path / path.stem, BuildOptions(target=target, toolkit="2.3.2")).manifest_data
        return sorted(op["type"] for op in manifest["ops"]["cpu_ops"])

    identity, perturbed = cpu_ops(_export(tmp_path, True)), cpu_ops(_export(tmp_path, False))
    reciprocal = cpu_ops(_export(tmp_path, True, monkeypatch, reciprocal=True))
    print(f"{target}: x/sqrt identity {identity}, perturbed {perturbed}; rsqrt identity {reciprocal}")
    assert identity == perturbed and "Div" not in identity
    # the control: the reciprocal form with identity weights puts its three Divs on the CPU (what the test guards)
    assert Counter(reciprocal) - Counter(perturbed) == Counter({"Div": 3})
