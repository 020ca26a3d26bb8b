"""fold_flips: a VITS reverse flow in small (channel flips between affine couplings, the frame mask, a conv)
folded exactly against a float64 numpy reference, with no flip left; a flip into an op it cannot fold through is
refused, naming the op."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.host.backends import OnnxBackend
from rkaudio.surgery.graph.flip_fold import FlipFoldError, fold_flips

HALF = 3


def _flow_graph(rng, mean_only: list[bool]):
    """z [1, 2*HALF, N] -> (flip -> coupling) per entry -> Mul(mask) -> Conv: a VITS reverse flow in small."""
    inits, nodes, params = {}, [], []
    inits["starts"], inits["ends"] = np.array([-1], np.int64), np.array([-(2**63) + 1], np.int64)
    inits["axes"], inits["steps"] = np.array([1], np.int64), np.array([-1], np.int64)
    inits["halves"] = np.array([HALF, HALF], np.int64)
    x = "z"
    for k, only_mean in enumerate(mean_only):
        p = {"pre_w": rng.standard_normal((4, HALF, 1)), "pre_b": rng.standard_normal(4),
             "post_w": rng.standard_normal((HALF * (1 if only_mean else 2), 4, 1)),
             "post_b": rng.standard_normal(HALF * (1 if only_mean else 2))}
        params.append(p)
        inits.update({f"{name}{k}": value for name, value in p.items()})
        nodes += [helper.make_node("Slice", [x, "starts", "ends", "axes", "steps"], [f"r{k}"]),
                  helper.make_node("Split", [f"r{k}", "halves"], [f"a{k}", f"b{k}"], axis=1),
                  helper.make_node("Conv", [f"a{k}", f"pre_w{k}", f"pre_b{k}"], [f"h{k}"]),
                  helper.make_node("Mul", [f"h{k}", "m"], [f"hm{k}"]),
                  helper.make_node("Tanh", [f"hm{k}"], [f"t{k}"]),
                  helper.make_node("Conv", [f"t{k}", f"post_w{k}", f"post_b{k}"], [f"s{k}"]),
                  helper.make_node("Mul", [f"s{k}", "m"], [f"sm{k}"])]
        if only_mean:
            nodes.append(helper.make_node("Sub", [f"b{k}", f"sm{k}"], [f"d{k}"]))
        else:
            nodes += [helper.make_node("Split", [f"sm{k}", "halves"], [f"mu{k}", f"logs{k}"], axis=1),
                      helper.make_node("Sub", [f"b{k}", f"mu{k}"], [f"e{k}"]),
                      helper.make_node("Neg", [f"logs{k}"], [f"n{k}"]),
                      helper.make_node("Exp", [f"n{k}"], [f"x{k}"]),
                      helper.make_node("Mul", [f"e{k}", f"x{k}"], [f"d{k}"])]
        nodes += [helper.make_node("Mul", [f"d{k}", "m"], [f"dm{k}"]),
                  helper.make_node("Concat", [f"a{k}", f"dm{k}"], [f"c{k}"], axis=1)]
        x = f"c{k}"
    out_w, out_b = rng.standard_normal((2, 2 * HALF, 3)), rng.standard_normal(2)
    inits["out_w"], inits["out_b"] = out_w, out_b
    nodes += [helper.make_node("Mul", [x, "m"], ["xm"]),
              helper.make_node("Conv", ["xm", "out_w", "out_b"], ["y"], pads=[1, 1])]
    graph = helper.make_graph(
        nodes, "flow", [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2 * HALF, "N"]),
                        helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, "N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v.astype(np.float32) if v.dtype == np.float64 else v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), params, (out_w, out_b)


def _reference(z, m, params, out, mean_only):
    """float64: flip, split, affine coupling (reverse direction), concat; then mask and a k=3 conv."""
    x = z
    for p, only_mean in zip(params, mean_only):
        x = x[::-1]
        a, b = x[:HALF], x[HALF:]
        h = np.tanh((np.einsum("oc,ct->ot", p["pre_w"][:, :, 0], a) + p["pre_b"][:, None]) * m)
        s = (np.einsum("oc,ct->ot", p["post_w"][:, :, 0], h) + p["post_b"][:, None]) * m
        mu, logs = (s, np.zeros_like(s)) if only_mean else (s[:HALF], s[HALF:])
        x = np.concatenate([a, (b - mu) * np.exp(-logs) * m])
    w, bias = out
    xp = np.pad(x * m, ((0, 0), (1, 1)))
    return sum(np.einsum("oc,ct->ot", w[:, :, j], xp[:, j : j + z.shape[1]]) for j in range(3)) + bias[:, None]


@pytest.mark.parametrize("mean_only", [[False, False, True], [True, True, True, True], [False]])
def test_fold_flips_is_exact_against_float64_reference(mean_only):
    rng = np.random.default_rng(3)
    model, params, out = _flow_graph(rng, mean_only)
    folded = fold_flips(model)
    assert not [n for n in folded.graph.node if n.op_type == "Slice"]
    z = rng.standard_normal((1, 2 * HALF, 17))
    m = np.ones((1, 1, 17))
    m[..., 13:] = 0.0
    feeds = {"z": z.astype(np.float32), "m": m.astype(np.float32)}
    want = _reference(z[0], m[0, 0], params, out, mean_only)
    np.testing.assert_allclose(OnnxBackend(model, threads=1).run(feeds)["y"][0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(OnnxBackend(folded, threads=1).run(feeds)["y"][0], want, rtol=1e-5, atol=1e-5)


def test_flip_into_an_unfoldable_op_is_refused():
    rng = np.random.default_rng(4)
    model, _, _ = _flow_graph(rng, [False])
    for node in model.graph.node:  # the flip now feeds a Relu instead of the coupling's Split
        if node.op_type == "Split" and node.input[0] == "r0":
            node.input[0] = "relu_out"
    model.graph.node.insert(1, helper.make_node("Relu", ["r0"], ["relu_out"]))
    with pytest.raises(FlipFoldError, match="Relu"):
        fold_flips(model)
