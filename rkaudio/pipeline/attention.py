"""Which attention form a family's graphs take on each target (issue #42): `native` (the exporter's Softmax) or
`exp_ratio` (`rkaudio.surgery.graph.attention.exp_ratio_attention`: heads at rank 3, exp as a Sigmoid ratio under
each row's max or a constant logit bound, the row sum in the value MatMul; the RK3566 runs Softmax and rank-4 attention layouts on its CPU).
A family states its table once (`AttentionForms`), justified by bench/attention_forms.py, and applies it to each
exported graph with `AttentionForms.apply`, which also judges the logit bound on the self-check inputs."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rkaudio.board.verdict import Verdict
from rkaudio.gates.logit_bound import logit_bound_verdicts

FORMS = ("native", "exp_ratio")
# onnx and the graph passes are imported inside the functions: a family declares its table at import, and
# `convert --help` imports every family (HACKING: CLI surface).


def attention_logits(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """The input of every Softmax of `model` on `feeds`, by Softmax name (onnxruntime fp32)."""
    import onnx

    from rkaudio.core.onnx_graph import GraphIndex
    from rkaudio.host.backends import OnnxBackend

    names = {node.name or node.output[0]: node.input[0] for node in GraphIndex(model).nodes
             if node.op_type == "Softmax"}
    if not names:
        return {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    declared = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in sorted(set(names.values())) if t not in declared)
    outputs = OnnxBackend(probe).run(feeds)
    return {softmax: outputs[tensor] for softmax, tensor in names.items()}


@dataclass(frozen=True)
class AttentionForms:
    """A family's attention form per target (absent targets: native) and the shift of its exp-ratio form: None, each
    row's max (any logits; a Relu tree of log2(keys) levels), or a constant logit bound (fewer ops; every logit at
    most it on the self-check inputs, each row's max within EXP_WINDOW below it)."""

    forms: dict = field(default_factory=dict)
    logit_bound: float | None = None

    def __post_init__(self):
        unknown = sorted(set(self.forms.values()) - set(FORMS))
        if unknown:
            raise ValueError(f"attention forms {unknown}: each target takes one of {FORMS}")

    def form(self, target: str) -> str:
        return self.forms.get(str(target), "native")

    def apply(self, model: onnx.ModelProto, target: str, feeds: dict,
              suffix: str = "") -> tuple[onnx.ModelProto, list[Verdict]]:
        """(`model` in `target`'s form, the logit-bound export verdicts on `feeds`: none for the native form)."""
        from rkaudio.surgery.graph.attention import exp_ratio_attention

        if self.form(target) == "native":
            return model, []
        verdicts = logit_bound_verdicts(attention_logits(model, feeds), self.logit_bound, suffix)
        return exp_ratio_attention(model, self.logit_bound), verdicts
