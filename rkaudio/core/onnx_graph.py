"""Lookups and cuts on one ONNX graph, shared by every pass and gate that needs them: producers and
consumers, constant values, statically known shapes, a cut between named tensors, tensor renames."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


class CutError(ValueError):
    """The named tensors do not delimit a subgraph."""


def node_attr(node: onnx.NodeProto, name: str, default=None):
    """The value of the node's attribute `name`, else `default`."""
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def constant_tensors(graph: onnx.GraphProto):
    """(name, TensorProto) of every initializer and every Constant node's `value`."""
    for tensor in graph.initializer:
        yield tensor.name, tensor
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.type == onnx.AttributeProto.TENSOR:
                    yield node.output[0], attribute.t


def constant_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Name -> value of every initializer and Constant node."""
    return {name: numpy_helper.to_array(tensor) for name, tensor in constant_tensors(graph)}


def inferred_dims(model: onnx.ModelProto, outputs: bool = True):
    """(name, dims) of each value_info/input/output entry after shape inference, None where a dim is still dynamic."""
    inferred = onnx.shape_inference.infer_shapes(model)
    for value in [*inferred.graph.value_info, *inferred.graph.input, *(inferred.graph.output if outputs else ())]:
        yield value.name, tuple(d.dim_value if d.HasField("dim_value") else None
                                for d in value.type.tensor_type.shape.dim)


def static_shapes(model: onnx.ModelProto, constants: bool = True,
                  outputs: bool = True) -> dict[str, tuple[int, ...]]:
    """Fully known shapes (+ the constants'); outputs=False skips declared output shapes, stale once re-pinned."""
    shapes = {name: dims for name, dims in inferred_dims(model, outputs) if dims and None not in dims}
    if constants:
        for name, tensor in constant_tensors(model.graph):
            shapes[name] = tuple(tensor.dims)
    return shapes


class GraphIndex:
    """Producer/consumer lookups for one graph (node order is topological in a valid ONNX graph)."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        self.model = model
        self.nodes = list(graph.node)
        # Positions in graph.node, for passes that rebuild the node list by position.
        self.producer_position = {out: i for i, node in enumerate(self.nodes) for out in node.output}
        self.consumer_positions: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in node.input:
                self.consumer_positions.setdefault(name, []).append(i)
        self.producer = {out: self.nodes[i] for out, i in self.producer_position.items()}
        self.consumers = {name: [self.nodes[i] for i in found] for name, found in self.consumer_positions.items()}
        self.initializers = {init.name for init in graph.initializer}
        self.graph_inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self._constants = set(self.initializers)
        for node in self.nodes:  # topological order: a node's inputs are classified before it
            if node.op_type == "Constant" or (node.input and all(i == "" or i in self._constants for i in node.input)):
                self._constants.update(node.output)

    def is_constant(self, name: str) -> bool:
        """True for initializers, Constant outputs and tensors computed from constants only."""
        return name == "" or name in self._constants

    def descendants(self, sources: set[str]) -> set[str]:
        """Every tensor computed (transitively) from `sources`, sources included."""
        reached = set(sources)
        for node in self.nodes:
            if any(i in reached for i in node.input):
                reached.update(node.output)
        return reached

    def ancestor_nodes(self, outputs: list[str], stop: set[str]) -> list[onnx.NodeProto]:
        """Nodes needed to compute `outputs` when the `stop` tensors are given."""
        needed, stack = set(), [o for o in outputs if o not in stop]
        while stack:
            node = self.producer.get(stack.pop())
            if node is None or id(node) in needed:
                continue
            needed.add(id(node))
            stack.extend(i for i in node.input if i and i not in stop)
        return [n for n in self.nodes if id(n) in needed]


def constant_value(index: GraphIndex, name: str):
    """Value of a constant tensor (initializer or Constant node), else None."""
    for init in index.model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    node = index.producer.get(name)
    if node is not None and node.op_type == "Constant":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def is_reversal(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """A flip as exporters write `torch.flip`: a Slice with a negative constant step."""
    if node.op_type != "Slice" or len(node.input) < 5:
        return False
    steps = constant_value(index, node.input[4])
    return steps is not None and bool((steps < 0).any())


def cut(model: onnx.ModelProto, inputs: list[str], outputs: list[str]) -> onnx.ModelProto:
    """The subgraph from the `inputs` tensors to the `outputs` tensors; CutError if the outputs need any
    other non-constant tensor. The new inputs are float with no shape (set them after the cut); metadata
    and value_info are not carried over (stale shapes would override pinned ones)."""
    index = GraphIndex(model)
    missing = [n for n in inputs + outputs if n not in index.producer and n not in index.graph_inputs]
    if missing:
        raise CutError(f"no tensor named {missing} in the graph")
    needed = index.ancestor_nodes(outputs, stop=set(inputs))
    leaks = sorted({i for n in needed for i in n.input if i and i in index.graph_inputs and i not in inputs})
    if leaks:
        raise CutError(f"cutting at {inputs} still needs graph inputs {leaks}: the cut does not separate the graph")
    used = {i for n in needed for i in n.input}
    graph_outputs = {o.name: o for o in model.graph.output}
    graph = onnx.helper.make_graph(
        needed, model.graph.name or "cut",
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in inputs],
        [graph_outputs.get(name) or onnx.helper.make_empty_tensor_value_info(name) for name in outputs],
        [init for init in model.graph.initializer if init.name in used])
    extracted = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    extracted.ir_version = model.ir_version
    return extracted


def rename_tensors(model: onnx.ModelProto, names: dict[str, str]) -> onnx.ModelProto:
    """Rename tensors everywhere they appear (graph inputs/outputs, node inputs/outputs, value_info)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for node in graph.node:
        node.input[:] = [names.get(i, i) for i in node.input]
        node.output[:] = [names.get(o, o) for o in node.output]
    for info in list(graph.input) + list(graph.output) + list(graph.value_info):
        info.name = names.get(info.name, info.name)
    return out


def live_nodes(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """`nodes` (in order) without those whose outputs nothing leading to `outputs` reads: what a rewrite left dead."""
    needed, live = set(outputs), []
    for node in reversed(nodes):
        if any(name in needed for name in node.output):
            live.append(node)
            needed.update(node.input)
    return live[::-1]


def drop_unused_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove initializers no node and no graph output reads (in place; returns the model)."""
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    live = [init for init in model.graph.initializer if init.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(live)
    return model


def weights_aside(model: onnx.ModelProto, names) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """(a new model whose initializers `names` are graph inputs of their type and shape, those initializers): a
    pass that never reads the weights runs on a graph of a few MB, and `model` can be dropped (protobuf frees a
    message's memory only with the whole message). `weights_back` puts them back."""
    names = set(names)
    graph = model.graph
    aside = {tensor.name: tensor for tensor in graph.initializer if tensor.name in names}
    inputs = list(graph.input) + [onnx.helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims))
                                  for name, tensor in aside.items()]
    return _regraphed(model, inputs, [tensor for tensor in graph.initializer if tensor.name not in aside]), aside


def weights_back(model: onnx.ModelProto, aside: dict[str, onnx.TensorProto]) -> onnx.ModelProto:
    """The inverse of `weights_aside` (in place; returns the model): each input named in `aside` becomes its
    initializer again, where the graph still reads it."""
    used = {name for node in model.graph.node for name in node.input}
    inputs = [value for value in model.graph.input if value.name not in aside]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(tensor for name, tensor in aside.items() if name in used)
    return model


def weightless(model: onnx.ModelProto) -> onnx.ModelProto:
    """A new model of `model`'s graph whose initializers keep their name, type and dims but hold no values: what a
    build reads once its host runs are done (I/O, names, the contract), so the weights are not held through a
    compile that needs every GB (protobuf frees them only with the whole message: drop `model` after this)."""
    return _regraphed(model, list(model.graph.input),
                      [onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=list(tensor.dims))
                       for tensor in model.graph.initializer])


def _regraphed(model: onnx.ModelProto, inputs: list, initializers: list) -> onnx.ModelProto:
    """A new model of `model`'s nodes, outputs, value_info, opsets, IR version and metadata over `inputs` and
    `initializers` (the skeletons above differ only in those two)."""
    graph = model.graph
    skeleton = onnx.helper.make_model(
        onnx.helper.make_graph(list(graph.node), graph.name, inputs, list(graph.output), initializers,
                               value_info=list(graph.value_info)),
        opset_imports=list(model.opset_import))
    skeleton.ir_version = model.ir_version
    skeleton.metadata_props.extend(model.metadata_props)
    return skeleton


def load_model(path, what: str = "ONNX model", load_external_data: bool = True) -> onnx.ModelProto:
    """The ONNX at `path`, refused up front with one line naming the file (and the tensor) when it is missing,
    unreadable, truncated, not ONNX at all, or carries a NaN/Inf constant (an fp16 engine of it is garbage)."""
    from pathlib import Path

    from rkaudio.core.errors import SetupError

    path = Path(path)
    if not path.is_file():
        raise SetupError(f"no {what} at {path}")
    try:
        model = onnx.load(str(path), load_external_data=load_external_data)
    except Exception as error:  # protobuf DecodeError, OSError, a missing external-data file, ...
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SetupError(f"{path} is not a readable {what} ({type(error).__name__}: {reason}): a truncated "
                         "download or another kind of file; copy or export it again") from None
    if not model.graph.node:
        raise SetupError(f"{path} is not a usable {what}: it has no graph nodes (a truncated or empty file?)")
    for name, tensor in constant_tensors(model.graph):
        if tensor.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                                    onnx.TensorProto.BFLOAT16) or not load_external_data and tensor.external_data:
            continue
        values = numpy_helper.to_array(tensor)
        if not np.all(np.isfinite(values)):
            count = int(np.sum(~np.isfinite(values)))
            raise SetupError(f"{path}: constant '{name}' holds {count} NaN/Inf value(s): the checkpoint is damaged "
                             "(or the export overflowed); nothing built from it can be right")
    return model
