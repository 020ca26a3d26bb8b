"""The seam is found by structure; the wrong seam (conv_pre) and non-VITS graphs are refused."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.families.piper import decoder
from rkaudio.host.backends import OnnxBackend
from rkaudio.core.errors import SetupError
from rkaudio.surgery.graph.vits_seam import SeamError, find_vits_seam
from rkaudio.core.onnx_graph import CutError, cut, rename_tensors


def _anonymised(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """Every node unnamed and every intermediate tensor renamed: no exporter naming is left to lean on."""
    keep = {i.name for i in model.graph.input} | {o.name for o in model.graph.output} | \
        {i.name for i in model.graph.initializer}
    names = {}
    for node in model.graph.node:
        for out in node.output:
            if out not in keep:
                names[out] = f"t{len(names)}"
    renamed = rename_tensors(model, names)
    for node in renamed.graph.node:
        node.name = ""
    return renamed, names


@pytest.mark.slow
def test_seam_found_by_structure_without_names(joe):
    seam = find_vits_seam(joe.model)
    assert seam.coupling_layers == 4 and seam.cond is None
    anonymous, names = _anonymised(joe.model)
    found = find_vits_seam(anonymous)
    assert (found.latent, found.mask, found.decoder_input) == (names[seam.latent], names[seam.mask],
                                                               names[seam.decoder_input])


@pytest.mark.slow
def test_slice_reproduces_the_voice_and_the_conv_pre_seam_is_caught(joe):
    assert decoder.seam_verdict(joe.full, joe.latents).passed
    # The known wrong seam: the decoder alone, fed the pre-flow latent the runtime has.
    wrong = rename_tensors(cut(joe.model, [joe.piece.seam.decoder_input], [joe.piece.seam.output]),
                           {joe.piece.seam.decoder_input: decoder.LATENT})
    verdict = decoder.seam_verdict(OnnxBackend(wrong, threads=1), joe.latents)
    assert not verdict.passed and verdict.value < 20.0


def _conv_graph(with_upsampler: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1])]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4, 3)).astype(np.float32), "w")]
    if with_upsampler:
        nodes.append(helper.make_node("ConvTranspose", ["h", "u"], ["y"], strides=[2], kernel_shape=[2]))
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 1, 2)).astype(np.float32), "u"))
    else:
        nodes.append(helper.make_node("Relu", ["h"], ["y"]))
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("with_upsampler,reason", [(True, "coupling"), (False, "ConvTranspose")])
def test_non_vits_graph_is_refused_with_a_reason(with_upsampler, reason):
    with pytest.raises(SeamError, match=reason):
        find_vits_seam(_conv_graph(with_upsampler))
    with pytest.raises(SetupError, match="not a Piper VITS voice"):
        decoder.slice_voice(_conv_graph(with_upsampler))


@pytest.mark.slow
def test_cut_that_does_not_separate_is_refused(joe):
    with pytest.raises(CutError, match="does not separate"):
        cut(joe.model, [joe.piece.seam.mask], [joe.piece.seam.output])
