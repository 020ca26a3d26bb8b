"""The placement table `convert doctor` reads (rkaudio/gates/placement.py): the signature a node is measured under,
`cpu_nodes` on a small graph (a measured CPU entry found, an unknown signature reported as unmeasured), the table
covering every signature of the five reduced speech models, and the table agreeing with a build of its probes."""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkaudio.core.errors import SetupError
from rkaudio.core.onnx_graph import constant_values, static_shapes
from rkaudio.core.paths import REPO_ROOT
from rkaudio.gates.placement import TABLE_FILE, cpu_nodes, load_table, model_signatures, placements, signature

# Measured entries of the table the tests lean on (rk3588, toolkit 2.3.2): a Snake's Sin on [1, C, T] runs on the
# CPU, a HiFi-GAN's LeakyRelu on the NPU.
SIN = "Sin[x1nn]->1nn"
LEAKY_RELU = "LeakyRelu[x1nn]->1nn"


def _model(nodes, inputs: dict, initializers: dict | None = None, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(value), name) for name, value in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _signature(node, inputs: dict, initializers: dict | None = None) -> str:
    model = _model([node], inputs, initializers)
    return signature(node, static_shapes(model, constants=False), constant_values(model.graph))


def _weight(out_channels: int, in_channels: int, kernel: int) -> np.ndarray:
    return np.ones((out_channels, in_channels, kernel), np.float32)


SIGNATURES = [
    (helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1]), {"x": [1, 64, 199]}, None,
     "Transpose[x1nu]->1un [1,a,b]->[1,b,a]"),
    (helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1]), {"x": [1, 199, 4, 16]}, None,
     "Transpose[x1uun]->1unu [1,a,b,c]->[1,b,c,a]"),
    (helper.make_node("Mul", ["scale", "x"], ["y"]), {"x": [1, 8, 400]}, {"scale": np.ones((1, 8, 1), np.float32)},
     "Mul[c3b2,x1nn]->1nn"),
    (helper.make_node("Div", ["x", "two"], ["y"]), {"x": [1, 8, 400]}, {"two": np.float32(2)}, "Div[x1nn,c0]->1nn"),
    (helper.make_node("Reshape", ["x", "shape"], ["y"]), {"x": [1, 199, 64]}, {"shape": np.array([-1, 64])},
     "Reshape[x1un,c1]->un [1,a,b]->[a,b]"),
    (helper.make_node("Reshape", ["x", "shape"], ["y"]), {"x": [1, 1500, 64]}, {"shape": np.array([1, -1, 4, 16])},
     "Reshape[x1un,c1]->1uun [1,a,b]->[1,a,b1,b2]"),
    (helper.make_node("Reshape", ["x", "shape"], ["y"]), {"x": [1, 199, 4, 16]}, {"shape": np.array([-1, 64])},
     "Reshape[x1uun,c1]->un [1,a,b,c]->[a,bc]"),
    (helper.make_node("Unsqueeze", ["x", "axes"], ["y"]), {"x": [1, 64000]}, {"axes": np.array([1])},
     "Unsqueeze[x1L,c1]->11L [1,a]->[1,1,a]"),
    (helper.make_node("Softmax", ["x"], ["y"]), {"x": [1, 4, 199, 199]}, None, "Softmax[x1uuu]->1uuu axis=-1"),
    (helper.make_node("Softmax", ["x"], ["y"], axis=3), {"x": [1, 4, 199, 199]}, None, "Softmax[x1uuu]->1uuu axis=-1"),
    (helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1), {"x": [1, 64, 400]}, None,
     "ReduceMean[x1nn]->11n axes=-2 keepdims=1"),
    (helper.make_node("Pow", ["x", "p"], ["y"]), {"x": [1, 8, 400]}, {"p": np.float32(2)}, "Pow[x1nn,c0]->1nn exp=2"),
    (helper.make_node("Pow", ["x", "p"], ["y"]), {"x": [1, 8, 400]}, {"p": np.float32(0.5)},
     "Pow[x1nn,c0]->1nn exp=0.5"),
    (helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"]), {"x": [1, 64, 200]},
     {"s": np.array([-1]), "e": np.array([-201]), "a": np.array([2]), "st": np.array([-1])},
     "Slice[x1nn,c1,c1,c1,c1]->1nn axes=-1 steps=-1"),
    (helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect"), {"x": [1, 8, 400]},
     {"pads": np.array([0, 0, 3, 0, 0, 3])}, "Pad[x1nn,c1]->1nu mode=reflect axes=-1"),
    (helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[7], pads=[27, 27], dilations=[9]),
     {"x": [1, 16, 400]}, {"w": _weight(16, 16, 7), "b": np.zeros(16, np.float32)},
     "Conv[x1nn,c3,c1]->1nn 1d channels=8k>8k groups=1 kernel=1-15 stride=1 dilation>1 pads>15"),
    (helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[7], pads=[3, 3], group=16),
     {"x": [1, 16, 400]}, {"w": _weight(16, 1, 7)},
     "Conv[x1nn,c3]->1nn 1d channels=8k>8k groups=depthwise kernel=1-15 stride=1 dilation=1 pads=1-15"),
    (helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[7], pads=[3, 3]), {"x": [1, 2, 9000]},
     {"w": _weight(1, 2, 7)}, "Conv[x1uL,c3]->11L 1d channels=2>1 groups=1 kernel=1-15 stride=1 dilation=1 pads=1-15"),
    (helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[32], strides=[16], pads=[8, 8]),
     {"x": [1, 16, 100]}, {"w": _weight(16, 8, 32)},
     "ConvTranspose[x1nu,c3]->1nn 1d channels=8k>8k groups=1 kernel>15 stride>8 dilation=1 pads=1-15"),
]


@pytest.mark.parametrize("node, inputs, initializers, expected", SIGNATURES, ids=[case[-1] for case in SIGNATURES])
def test_signature_keys_the_facts_that_change_placement(node, inputs, initializers, expected):
    assert _signature(node, inputs, initializers) == expected


def test_an_omitted_optional_input_and_a_computed_operand_are_keyed_apart():
    computed = _signature(helper.make_node("Mul", ["x", "s"], ["y"]), {"x": [1, 8, 400], "s": [1, 8, 1]})
    assert computed == "Mul[x1nn,x1n1b2]->1nn"
    omitted = _signature(helper.make_node("Clip", ["x", "", "high"], ["y"]), {"x": [1, 8, 400]},
                         {"high": np.float32(1)})
    assert omitted == "Clip[x1nn,-,c0]->1nn"


def _snake_and_leaky_relu() -> onnx.ModelProto:
    """A Sin and a LeakyRelu side by side on [1, 16, 400] (no tensor between them, so a conversion the compiler
    adds for one is named after that one's tensors alone), their sum through a HardSwish (an op none of the
    measured models holds)."""
    nodes = [helper.make_node("Sin", ["x"], ["s"], name="snake_sin"),
             helper.make_node("LeakyRelu", ["z"], ["l"], name="leaky", alpha=0.1),
             helper.make_node("Add", ["s", "l"], ["a"], name="add"),
             helper.make_node("HardSwish", ["a"], ["y"], name="hard_swish")]
    return _model(nodes, {"x": [1, 16, 400], "z": [1, 16, 400]})


def test_cpu_nodes_names_a_measured_cpu_node_and_an_unmeasured_one():
    table = load_table()
    assert table["toolkits"]["2.3.2"]["rk3588"][SIN] == "cpu"  # the measured entries this test leans on
    assert table["toolkits"]["2.3.2"]["rk3588"][LEAKY_RELU] == "npu"
    found = {p.node_name: p for p in cpu_nodes(_snake_and_leaky_relu(), "RK3588", "2.3.2")}
    assert set(found) == {"snake_sin", "hard_swish"}
    assert (found["snake_sin"].where, found["snake_sin"].signature) == ("cpu", SIN)
    assert "Sin" in found["snake_sin"].detail  # the compiler's CPU layer behind the entry
    assert found["hard_swish"].where == "unmeasured" and "no probe" in found["hard_swish"].detail
    every = placements(_snake_and_leaky_relu(), "rk3588", "2.3.2")
    assert [(p.node_name, p.where) for p in every] == [("snake_sin", "cpu"), ("leaky", "npu"), ("add", "npu"),
                                                       ("hard_swish", "unmeasured")]


def test_a_target_or_toolkit_the_table_never_measured_is_a_setup_error():
    with pytest.raises(SetupError, match="rk3568 with toolkit 2.3.2"):
        cpu_nodes(_snake_and_leaky_relu(), "rk3568", "2.3.2")
    with pytest.raises(SetupError, match="rk3588 with toolkit 9.9.9"):
        cpu_nodes(_snake_and_leaky_relu(), "rk3588", "9.9.9")


def test_the_table_names_the_command_that_regenerates_it_and_every_cell():
    table = load_table()
    assert table["regenerate"] == "make bench NAME=placement ARGS=--write-table"
    assert {kit: sorted(socs) for kit, socs in table["toolkits"].items()} == {
        kit: sorted(["rk3566", "rk3576", "rk3588"]) for kit in ("2.3.2", "2.5.0")}
    assert set(table["measured"]["models"]) == {"speecht5_hifigan", "mms_tts_decoder", "dac_decoder",
                                                "wav2vec2_encoder", "whisper_encoder"}
    assert TABLE_FILE.parent.name == "gates"  # package data beside its reader (pyproject.toml: gates/*.json)


@pytest.fixture(scope="module")
def reduced_speech_models(tmp_path_factory) -> dict:
    """The five reduced speech models of tests/speech_models.py, exported and folded as the doctor sees them."""
    from rkaudio.surgery.graph.fold import fold_fixed
    from tests.speech_models import MODELS, export

    folder = tmp_path_factory.mktemp("speech_models")
    return {name: fold_fixed(onnx.load(export(name, folder / f"{name}.onnx", size="reduced"))) for name in MODELS}


def test_the_table_covers_every_signature_of_the_five_reduced_speech_models(reduced_speech_models):
    """Every signature is measured in every cell, or probed there without a clear answer (unresolved, with the
    reason: never a silent gap)."""
    table = load_table()
    for toolkit, socs in table["toolkits"].items():
        for target, where in socs.items():
            unresolved = table["unresolved"].get(toolkit, {}).get(target, {})
            for name, model in reduced_speech_models.items():
                missing = {key for _, key in model_signatures(model)} - set(where) - set(unresolved)
                assert not missing, f"{name}, {toolkit} {target}: not in the table: {sorted(missing)}"


def _bench_placement():
    spec = importlib.util.spec_from_file_location("bench_placement", REPO_ROOT / "bench" / "placement.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_cpu_layer_is_the_probe_nodes_when_it_names_the_node_or_a_tensor_the_node_touches():
    bench = _bench_placement()
    probes = [bench.Probe(3, "", "", 17, own=frozenset({"probe3_t1", "probe3_t2"})),
              bench.Probe(4, "", "", 17, own=frozenset({"probe4_t0"}), edge=True)]
    layers = [("probe3", "Sin"),                        # the node itself
              ("probe3_t1_rs_pad", "Pad"),              # a conversion of its input
              ("probe3_n0", "Erf"),                     # a neighbour's own CPU op: not the node's
              ("probe3_t5_tp", "Transpose"),            # a tensor between two neighbours
              ("probe4#1_rs_tp", "Transpose"),          # a layer the compiler split off the node
              ("", "Transpose"),                        # names no probe
              ("probe3_t1_probe4_t0", "Concat")]        # names two
    owned, unclear = bench.attribute([{"name": name, "type": kind, "unit_axes_only": False}
                                      for name, kind in layers], probes)
    assert owned == {3: ["Sin", "Pad"], 4: ["Transpose"]}
    assert unclear == ["Transpose:", "Concat:probe3_t1_probe4_t0"]
    # a Reshape of unit axes on a tensor of a node at the model's edge is the model's I/O glue, not the node's
    glue = [{"name": f"probe{number}_t0_rs", "type": "Reshape", "unit_axes_only": True} for number in (3, 4)]
    assert bench.attribute(glue, [bench.Probe(3, "", "", 17, own=frozenset({"probe3_t0"})), probes[1]]) == (
        {3: ["Reshape"]}, [])


@pytest.mark.slow
def test_the_table_agrees_with_a_build_of_a_cpu_and_an_npu_probe(tmp_path, require_converter):
    """A Sin (CPU in the table) and a LeakyRelu (NPU) probed in a small graph, built for rk3588 with toolkit 2.3.2:
    the build places them where the table says, so the table cannot rot silently when the toolkit changes."""
    require_converter("2.3.2")
    bench = _bench_placement()
    model = _snake_and_leaky_relu()
    keys = dict((node.name, key) for node, key in model_signatures(model))
    assert (keys["snake_sin"], keys["leaky"]) == (SIN, LEAKY_RELU)
    table = load_table()["toolkits"]["2.3.2"]["rk3588"]
    nodes = {node.name: node for node in model.graph.node}
    probes = [bench.make_probe(number, keys[name], f"test:{name}", nodes[name], model, radius=1)
              for number, name in enumerate(["snake_sin", "leaky"])]
    answers = bench.measure(probes, "rk3588", "2.3.2", tmp_path, log=lambda line: None)
    assert {probe.signature: answers[probe.number].where for probe in probes} == {SIN: table[SIN],
                                                                                 LEAKY_RELU: table[LEAKY_RELU]}
