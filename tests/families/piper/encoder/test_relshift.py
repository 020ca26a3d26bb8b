"""rkaudio.surgery.graph.relshift on a small random-init VITS relative attention (piper-tts's own module), exported at a
fixed width: the chain detector (and the piper encoder's gate on it) and the banded rewrite against a numpy
float64 reference (the skew on its own: tests/surgery/test_relshift.py)."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort
import pytest

from rkaudio.families.piper.encoder import shift_chain_verdict
from rkaudio.surgery.graph.fold import fold_fixed, fold_static_shapes
from rkaudio.surgery.graph.relshift import banded_relative_attention, find_shift_chains

CHANNELS, HEADS, WINDOW = 16, 2, 4


def _attention(seed: int):
    import torch

    from piper.train.vits.attentions import MultiHeadAttention

    torch.manual_seed(seed)
    attention = MultiHeadAttention(CHANNELS, CHANNELS, HEADS, window_size=WINDOW).eval()
    with torch.no_grad():  # emb_rel_* start random already; make biases non-zero too
        for conv in (attention.conv_q, attention.conv_k, attention.conv_v, attention.conv_o):
            conv.bias.normal_(0.0, 0.3)
    return attention


def _export(attention, width: int, path) -> onnx.ModelProto:
    import torch

    class Masked(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, x_mask):
            return self.inner(x, x, x_mask.unsqueeze(2) * x_mask.unsqueeze(-1))

    x, mask = torch.zeros(1, CHANNELS, width), torch.ones(1, 1, width)
    torch.onnx.export(Masked(attention), (x, mask), str(path), input_names=["x", "x_mask"], output_names=["y"],
                      opset_version=15, dynamo=False, dynamic_axes={"x": {2: "n"}, "x_mask": {2: "n"}})
    model = onnx.load(str(path))
    from rkaudio.surgery.graph.fold import pin_input_shapes

    return fold_fixed(fold_static_shapes(pin_input_shapes(model, {"x": [1, CHANNELS, width],
                                                                   "x_mask": [1, 1, width]})))


def _reference(attention, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """VITS relative attention written from its definition, float64, one relative offset at a time."""
    weights = {name: p.detach().double().numpy() for name, p in attention.named_parameters()}

    def conv(name, v):
        return np.einsum("oc,cn->on", weights[f"{name}.weight"][:, :, 0], v) + weights[f"{name}.bias"][:, None]

    x = x[0].astype(np.float64)
    n, depth = x.shape[1], CHANNELS // HEADS
    q, k, v = (conv(name, x).reshape(HEADS, depth, n) for name in ("conv_q", "conv_k", "conv_v"))
    q = q / math.sqrt(depth)
    scores = np.einsum("hdi,hdj->hij", q, k)
    emb_k, emb_v = weights["emb_rel_k"][0], weights["emb_rel_v"][0]
    for offset in range(-WINDOW, WINDOW + 1):
        for i in range(n):
            if 0 <= i + offset < n:
                scores[:, i, i + offset] += q[:, :, i] @ emb_k[offset + WINDOW]
    valid = (mask[0, 0][:, None] * mask[0, 0][None, :]) != 0
    scores = np.where(valid[None], scores, -1e4)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("hij,hdj->hdi", probs, v)
    for offset in range(-WINDOW, WINDOW + 1):
        for i in range(n):
            if 0 <= i + offset < n:
                out[:, :, i] += probs[:, i, i + offset][:, None] * emb_v[offset + WINDOW][None, :]
    return conv("conv_o", out.reshape(CHANNELS, n))[None]


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.fixture(scope="module")
def attention_graphs(tmp_path_factory):
    attention = _attention(0)
    width = 24
    raw = _export(attention, width, tmp_path_factory.mktemp("relshift") / "attention.onnx")
    return attention, width, raw, banded_relative_attention(raw)


def test_detector_finds_both_chains_and_gate_fails_on_them(attention_graphs):
    _, _, raw, _ = attention_graphs
    kinds = sorted(chain.kind for chain in find_shift_chains(raw))
    assert kinds == ["abs_to_rel", "rel_to_abs"]
    verdict = shift_chain_verdict(raw)
    assert not verdict.passed and verdict.value == 2


def test_banded_rewrite_matches_float64_reference(attention_graphs):
    attention, width, raw, banded = attention_graphs
    assert shift_chain_verdict(banded).passed
    ops = {node.op_type for node in banded.graph.node}
    assert not ops & {"Pad", "Slice", "Where", "Equal", "Gather", "GatherElements"}
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, CHANNELS, width)).astype(np.float32)
    for length in (width, 17):
        mask = np.zeros((1, 1, width), dtype=np.float32)
        mask[..., :length] = 1
        reference = _reference(attention, x, mask)[..., :length]
        for model in (raw, banded):
            got = _run(model, {"x": x, "x_mask": mask})[..., :length]
            np.testing.assert_allclose(got, reference, rtol=0, atol=2e-5)


def test_band_constant_is_shared_and_small(attention_graphs):
    _, width, _, banded = attention_graphs
    bands = [init for init in banded.graph.initializer if "band" in init.name]
    # one tensor per use (logits, weights), each [1, N, 2w+1, N]: 9 diagonals x N^2, not N^3
    assert len(bands) == 2
    assert all(list(b.dims) == [1, width, 2 * WINDOW + 1, width] for b in bands)


def _feeds(width: int, length: int) -> dict:
    x = np.random.default_rng(2).standard_normal((1, CHANNELS, width)).astype(np.float32)
    mask = np.zeros((1, 1, width), dtype=np.float32)
    mask[..., :length] = 1
    return {"x": x, "x_mask": mask}


def _rk3566_error(attention, model: onnx.ModelProto, width: int) -> float:
    """Largest |rk3566 form - float64 reference| on the real frames, over a full and a padded input; the padded
    queries (rows with every key masked) must come out finite."""
    worst = 0.0
    for length in (width, 17):
        feeds = _feeds(width, length)
        got = _run(model, feeds)
        assert np.isfinite(got).all()
        worst = max(worst, float(np.max(np.abs(got[..., :length] - _reference(attention, feeds["x"],
                                                                             feeds["x_mask"])[..., :length]))))
    return worst


def test_rk3566_form_matches_float64_reference_at_its_logit_bound(attention_graphs):
    """The exp-ratio form (no Softmax, the row sum from the ones column of [V | 1]) equals softmax attention while
    every logit is at most the bound; the bound here is the largest logit of the inputs, rounded up."""
    from rkaudio.gates.logit_bound import logit_bound_verdicts
    from rkaudio.pipeline.attention import attention_logits

    attention, width, raw, _ = attention_graphs
    logits = {}
    for length in (width, 17):
        for name, value in attention_logits(raw, _feeds(width, length)).items():
            logits[f"{name}@{length}"] = value
    bound = math.ceil(max(float(np.max(v)) for v in logits.values()))
    assert all(v.passed for v in logit_bound_verdicts(logits, bound))
    form = banded_relative_attention(raw, logit_bound=bound)
    ops = {node.op_type for node in form.graph.node}
    assert not ops & {"Softmax", "Exp", "ReduceMax", "Pad", "Where", "Equal"} and "Sigmoid" in ops
    assert shift_chain_verdict(form).passed
    assert _rk3566_error(attention, form, width) < 2e-5


@pytest.mark.parametrize("fault", ["bound below the largest logit", "ones column of [V | 1] dropped"])
def test_rk3566_form_planted_fault_fails_the_reference(attention_graphs, fault):
    attention, width, raw, _ = attention_graphs
    largest = max(float(np.max(v)) for v in _logits(raw, width).values())
    if fault == "bound below the largest logit":
        form = banded_relative_attention(raw, logit_bound=largest - 1.0)
    else:
        form = banded_relative_attention(raw, logit_bound=math.ceil(largest))
        ones = [node for node in form.graph.node if node.op_type == "Concat" and "ValuesAndOnes" in node.name]
        assert ones
        for node in ones:  # the row sum column becomes 0: every row normalised by the floor instead
            initializer = next(i for i in form.graph.initializer if i.name == node.input[1])
            initializer.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(initializer)),
                                                         initializer.name))
    assert _rk3566_error(attention, form, width) > 1e-3


def _logits(raw: onnx.ModelProto, width: int) -> dict:
    from rkaudio.pipeline.attention import attention_logits

    return attention_logits(raw, _feeds(width, width))
