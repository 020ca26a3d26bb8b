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


def _feeds(width: int, length: int, scale: float = 1.0) -> dict:
    x = np.random.default_rng(2).standard_normal((1, CHANNELS, width)).astype(np.float32) * np.float32(scale)
    mask = np.zeros((1, 1, width), dtype=np.float32)
    mask[..., :length] = 1
    return {"x": x, "x_mask": mask}


def _rk3566_error(attention, model: onnx.ModelProto, width: int, scale: float = 1.0) -> float:
    """Largest |rk3566 form - float64 reference| on the real frames, over a full and a padded input (x times
    `scale`); the padded queries must come out finite."""
    worst = 0.0
    for length in (width, 17):
        feeds = _feeds(width, length, scale)
        got = _run(model, feeds)
        assert np.isfinite(got).all()
        reference = _reference(attention, feeds["x"], feeds["x_mask"])[..., :length]
        worst = max(worst, float(np.max(np.abs(got[..., :length] - reference)) / np.max(np.abs(reference))))
    return worst


def _logits(raw: onnx.ModelProto, width: int, scale: float = 1.0) -> dict:
    """The raw graph's attention logits (its Softmax inputs) on a full and a padded input (x times `scale`)."""
    from rkaudio.pipeline.attention import attention_logits

    return {f"{name}@{length}": value for length in (width, 17)
            for name, value in attention_logits(raw, _feeds(width, length, scale)).items()}


def _assert_rk3566_ops(form: onnx.ModelProto) -> None:
    """No op the RK3566 runs on its CPU in the form: no Softmax, Exp, max or mask select, and no Transpose of its own
    (the band products are a DFT at [heads, query, *])."""
    ops = {node.op_type for node in form.graph.node}
    assert not ops & {"Softmax", "Exp", "ReduceMax", "Max", "Pad", "Where", "Equal"} and "Sigmoid" in ops
    assert not [node.name for node in form.graph.node
                if node.op_type == "Transpose" and node.name.startswith("relattn")]
    assert shift_chain_verdict(form).passed


@pytest.mark.parametrize("scale", [1.0, 6.0])
def test_rk3566_form_matches_float64_reference_under_the_row_max(attention_graphs, scale):
    """The exp-ratio form shifted by each row's max (no bound) equals softmax attention, also with logits far past any
    fp16-safe constant bound (x times 6)."""
    from rkaudio.gates.logit_bound import logit_bound_verdicts

    attention, width, raw, _ = attention_graphs
    logits = _logits(raw, width, scale)
    largest = max(float(np.max(np.where(v > -1e3, v, -np.inf))) for v in logits.values())
    assert largest > (20.0 if scale > 1 else 0.0)
    assert all(v.passed for v in logit_bound_verdicts(logits, None))
    form = banded_relative_attention(raw, "exp_ratio")
    _assert_rk3566_ops(form)
    assert _rk3566_error(attention, form, width, scale) < 1e-5


def test_rk3566_form_matches_float64_reference_at_its_logit_bound(attention_graphs):
    """With a constant bound (the largest logit of the inputs, rounded up) instead of the row max, the same."""
    from rkaudio.gates.logit_bound import logit_bound_verdicts

    attention, width, raw, _ = attention_graphs
    logits = _logits(raw, width)
    bound = math.ceil(max(float(np.max(v)) for v in logits.values()))
    assert all(v.passed for v in logit_bound_verdicts(logits, bound))
    form = banded_relative_attention(raw, "exp_ratio", logit_bound=bound)
    _assert_rk3566_ops(form)
    assert _rk3566_error(attention, form, width) < 1e-5


def _planted(form: onnx.ModelProto, name_part: str, change) -> onnx.ModelProto:
    """`form` with every initializer whose name contains `name_part` replaced by change(its values)."""
    found = [i for i in form.graph.initializer if name_part in i.name]
    assert found
    for initializer in found:
        initializer.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(initializer).copy()),
                                                     initializer.name))
    return form


def _wrong_phase_column(phase: np.ndarray) -> np.ndarray:
    phase[..., 1] *= -1.0  # the sine of the first non-zero frequency, sign flipped
    return phase


@pytest.mark.parametrize("fault", ["bound below the largest logit", "ones column of [V | 1] dropped",
                                   "a wrong phase column of the relative bias", "a wrong phase column of the values"])
def test_rk3566_form_planted_fault_fails_the_reference(attention_graphs, fault):
    attention, width, raw, _ = attention_graphs
    largest = max(float(np.max(v)) for v in _logits(raw, width).values())
    if fault == "bound below the largest logit":
        form = banded_relative_attention(raw, "exp_ratio", logit_bound=largest - 1.0)
    elif fault == "ones column of [V | 1] dropped":  # the row sum column 0: every row normalised by the floor
        form = _planted(banded_relative_attention(raw, "exp_ratio"), "/ones", np.zeros_like)
    else:
        part = "bias_phase" if "bias" in fault else "values_phase"
        form = _planted(banded_relative_attention(raw, "exp_ratio"), part, _wrong_phase_column)
    assert _rk3566_error(attention, form, width) > 1e-3


def test_rk3566_form_refuses_a_mask_it_cannot_split_into_keys(attention_graphs):
    """The form masks keys only, so a masked_fill whose mask is not m_i * m_j of one key mask is refused."""
    _, width, raw, _ = attention_graphs
    other = onnx.ModelProto()
    other.CopyFrom(raw)
    equal = next(node for node in other.graph.node if node.op_type == "Equal")
    other.graph.input.append(onnx.helper.make_tensor_value_info("pair_mask", onnx.TensorProto.FLOAT,
                                                                [1, 1, width, width]))
    equal.input[0] = "pair_mask"
    with pytest.raises(ValueError, match="not m_i \\* m_j of one key mask"):
        banded_relative_attention(other, "exp_ratio")
    assert shift_chain_verdict(banded_relative_attention(other)).passed  # the native form takes any mask
