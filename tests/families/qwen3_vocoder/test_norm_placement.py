"""Placement does not hang on weight values (issue #14, item 5): the tiny B=16 step with RMSNorm weights exactly 1
(a freshly initialised checkpoint) compiles with the same CPU ops as with perturbed ones.

The exported rsqrt was Div(1, Sqrt(...)): with identity weights the fold drops the Mul after it and the toolkit
puts the Div on the CPU (the real-shape B=16 step: 35 CPU ops instead of 18). step.RMSNorm writes x / sqrt(...).
Measured on a Linear -> RMSNorm -> Linear graph (hidden 512 and 16, 16 frames), CPU ops identity / perturbed:
  rknn-toolkit2 2.3.2   rsqrt: rk3588 1/0, rk3576 1/0, rk3562 1/0, rk3566 2/1, rk3568 2/1 (the extra one a Div)
                        x / sqrt: 0/0, 0/0, 0/0, 1/1, 1/1 (rk3566/rk3568: a Transpose, there in every form)
                        Pow(-0.5): 0/0, 0/0, 0/0, 2/2, 2/2 (one more Transpose)
  rknn-toolkit2 2.5.0   rsqrt and x / sqrt: 0/0 on every target.
Two tiny engine builds (no simulator), seconds each."""
from __future__ import annotations

import pytest
import torch

from rkaudio.engine.build import BuildOptions, build_engine
from rkaudio.families.qwen3_vocoder import step_export as E
from rkaudio.families.qwen3_vocoder.random_model import TINY_CONFIG, step_of


def norm_weights(step, identity: bool):
    """The RMSNorm weights of `step` (every layer's two and the final one) set to exactly 1, or left perturbed."""
    from rkaudio.families.qwen3_vocoder.step import RMSNorm

    norms = [m for m in step.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 2 * TINY_CONFIG["num_hidden_layers"] + 1
    if identity:
        with torch.no_grad():
            for norm in norms:
                norm.weight.fill_(1.0)
    else:
        assert all(not torch.all(norm.weight == 1.0) for norm in norms)  # the random model perturbs them
    return step


@pytest.mark.parametrize("target", ["rk3588"])
def test_identity_norm_weights_place_like_perturbed_ones(step_job, tiny_reference, tmp_path, require_converter,
                                                         target):
    require_converter()
    cpu = {}
    for identity in (True, False):
        step = norm_weights(step_of(tiny_reference, TINY_CONFIG), identity)
        name = "identity" if identity else "perturbed"
        with torch.no_grad():
            record = E.export_step(step_job, step, 16, "first", tmp_path / f"{name}.onnx", say=lambda *_: None)
        result = build_engine(record.onnx, tmp_path / "engines", BuildOptions(target=target))
        ops = result.manifest_data["ops"]
        cpu[name] = (ops["cpu"], sorted(op["type"] for op in ops["cpu_ops"]))
    print(f"tiny B=16 step for {target}, CPU ops: {cpu}")
    assert cpu["identity"] == cpu["perturbed"]
    assert "Div" not in cpu["identity"][1]
