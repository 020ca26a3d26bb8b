"""Which ops each SoC and toolkit runs on the CPU: the placement table `convert doctor` reads
(rkaudio/gates/placement_table.json, through rkaudio.gates.placement).

For the models given (default: the five reduced speech models of tests/speech_models.py, exported and folded with
`fold_fixed`, as the doctor sees them), each node signature (`rkaudio.gates.placement.signature`) is probed once in
each model that holds it: its first node there, cut out with its neighbourhood (the nodes up to --radius data edges
away, 5 by default) at the model's own shapes and constants; the tensors the neighbourhood reads from outside become
graph inputs, those nothing inside it reads become graph outputs. The neighbours matter, measured: a lone Erf is a
CPU op on every SoC, but the compiler fuses the Div-Erf-Add-Mul-Mul around a GELU's Erf into one NPU op (radius 3
sees it); on the RK3566 it rewrites a whole attention block, LayerNorm to out_proj, into channel-first NPU layers
(radius 5 sees it; at radius 2, 18 of whisper's nodes came out CPU that the whole build keeps on the NPU); two Adds
around a one-channel Conv made the RK3566 (2.3.2) add a CPU Transpose its real consumer, a Tanh, does not. The
model's own shapes matter too (InstanceNormalization takes CPU Transposes past 8,192 samples on the RK3588), so the
probes are not shrunk: a probe's tensors are as long as its model's.

Up to --probes-per-graph probes are independent branches of one graph, built for each target and toolkit by
`build_engine` (a self-check on random inputs, no gate but the build's own). The manifest's CPU ops (`ops.cpu_ops`;
the build log's layer table when a gate failed) are mapped back to their probe by the name the compiler gives a
layer, that of its node or of the tensor it converts: a probe's node is `probe<n>`, its neighbours `probe<n>_n<i>`,
its tensors `probe<n>_t<i>` and constants `probe<n>_k<i>`. A CPU op is the probe node's when it names that node
(`probe7`, `probe7#1_rs_tp`) or a tensor or constant the node reads or writes (`probe7_t3_rs_pad`); a neighbour's
own CPU ops are not, nor a Reshape of unit axes at a node next to the model's own input or output (I/O glue,
which a build of the model counts apart). A CPU op that names no probe, or several, leaves the graph's NPU answers
uncertain: those probes are built again alone, and what is still unclear is recorded as unresolved, never guessed.
A graph the build refuses (the rk3576 compilers die of SIGILL on some, 2.5.0's attention fusion fails on others)
is split in halves until the probe it refuses stands alone, which is then measured with another radius
(`other_radius`). A signature is "cpu" in the table where any model's probe kept a CPU op for its node, "npu"
where every probe that built says so.

Rows: one per probe x toolkit x target. `--write-table` rewrites rkaudio/gates/placement_table.json with what this
run measured (run it with every model the table must cover). `--verify` also builds each model whole for each
target and toolkit and adds a row per build: its CPU ops that no node the table puts on the CPU explains (a CPU op
is explained by a node whose name, or a tensor it reads or writes, begins the op's name), and the nodes the table
puts on the CPU that no CPU op of the build names: what the per-node table misses either way.

Measured 2026-12-05 (about 20 min, 22 with --verify): 102 signatures in 158 probes. 26 of the 30 whole builds
(5 models x 3 SoCs x 2 toolkits) keep exactly the CPU ops the table names. The 4 others are the RK3566's
transformers, on both toolkits: wav2vec2's v_proj Reshapes and a Transpose of its attention run on the CPU where
the table says NPU (the probe of that signature is the q_proj node, which stays on the NPU), and whisper's second
attention MatMul stays on the NPU where the table says CPU (its signature keeps a CPU Transpose in wav2vec2's
attention): one signature, two fates, which a per-node table cannot tell apart."""
from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TARGETS = ("rk3588", "rk3576", "rk3566")
TOOLKITS = ("2.3.2", "2.5.0")
REGENERATE = "make bench NAME=placement ARGS=--write-table"
# a layer's name as the compiler derives it from a probe's node, neighbour, tensor or constant
PROBE_PART = re.compile(r"probe(\d+)(?:_([ntk])(\d+))?(?!\d)")


class ProbeError(ValueError):
    """A node that cannot be probed as it stands (a tensor without a static shape, a non-float boundary)."""


@dataclass
class Probe:
    """One signature's node and its neighbourhood as an independent branch of a probe graph."""

    number: int
    signature: str
    origin: str  # model:node it was cut from
    opset: int
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    inputs: dict = field(default_factory=dict)  # graph input name -> shape
    outputs: dict = field(default_factory=dict)  # graph output name -> shape
    own: frozenset = frozenset()  # the names of the tensors and constants the probe node reads or writes
    edge: bool = False  # the node or a neighbour of it reads a model input or writes a model output


@dataclass
class Answer:
    """Where one probe's node ran in one build: "cpu", "npu" or "unresolved" (`detail` says why)."""

    where: str
    cpu_layers: list = field(default_factory=list)  # the op types of its CPU layers
    detail: str = ""
    graph: str = ""  # the probes built together


def load_models(names: list[str], work: Path) -> dict:
    """{name: folded ModelProto}: a name of tests/speech_models.py's MODELS (exported at its reduced size), or a
    path to an ONNX file; folded with `fold_fixed`, as the doctor sees them."""
    import onnx

    from rkaudio.surgery.graph.fold import fold_fixed
    from tests.speech_models import MODELS, export

    models = {}
    for name in names:
        if name in MODELS:
            models[name] = fold_fixed(onnx.load(export(name, work / f"{name}.onnx", size="reduced")))
        elif Path(name).is_file():
            models[Path(name).stem] = fold_fixed(onnx.load(name))
        else:
            raise SystemExit(f"--models {name}: neither a model of tests/speech_models.py ({', '.join(MODELS)}) "
                             "nor an ONNX file")
    return models


def first_nodes(models: dict) -> tuple[list, dict]:
    """([(signature, model name, its first node of that signature, model)], {model name: its number of
    signatures}): each signature is probed once per model that holds it, in that model's neighbourhood."""
    from rkaudio.gates.placement import model_signatures

    found, per_model = [], {}
    for name, model in models.items():
        seen = {}
        for node, key in model_signatures(model):
            seen.setdefault(key, node)
        per_model[name] = len(seen)
        found += [(key, name, node, model) for key, node in seen.items()]
    return sorted(found, key=lambda entry: (entry[0], entry[1])), per_model


def neighbourhood(model, centre, radius: int, constants: dict) -> list:
    """The nodes of `model` (in its order) up to `radius` data edges from `centre` (an edge: a computed tensor one
    node writes and the other reads)."""
    producer = {name: node for node in model.graph.node for name in node.output}
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    reached, frontier = {id(centre)}, [centre]
    for _ in range(radius):
        following = []
        for node in frontier:
            near = [producer[name] for name in node.input if name in producer and name not in constants]
            near += [reader for name in node.output for reader in readers.get(name, [])]
            for other in near:
                if id(other) not in reached and other.op_type != "Constant":
                    reached.add(id(other))
                    following.append(other)
        frontier = following
    return [node for node in model.graph.node if id(node) in reached]


def make_probe(number: int, key: str, origin: str, centre, model, radius: int) -> Probe:
    """The node of signature `key` (`centre`) and its neighbourhood, renamed `probe<number>...`: the tensors it
    reads from outside as graph inputs, those nothing inside it reads as graph outputs."""
    import onnx
    from onnx import TensorProto, numpy_helper

    from rkaudio.core.onnx_graph import constant_values, static_shapes
    from rkaudio.gates.placement import signature

    shapes, constants = static_shapes(model, constants=False), constant_values(model.graph)
    float_tensors = {value.name for value in [*onnx.shape_inference.infer_shapes(model).graph.value_info,
                                              *model.graph.input, *model.graph.output]
                     if value.type.tensor_type.elem_type == TensorProto.FLOAT}
    nodes = neighbourhood(model, centre, radius, constants)
    written = {name for node in nodes for name in node.output}
    read_inside = {name for node in nodes for name in node.input}
    tag = f"probe{number}"
    renamed: dict[str, str] = {}
    for name in dict.fromkeys(name for node in nodes for name in [*node.input, *node.output] if name):
        renamed[name] = f"{tag}_k{len(renamed)}" if name in constants else f"{tag}_t{len(renamed)}"
    boundary_in = [name for name in dict.fromkeys(n for node in nodes for n in node.input if n)
                   if name not in written and name not in constants]
    # only the tensors nothing inside reads: one both read inside and handed out would make the compiler keep it
    # in two layouts, a CPU conversion the model does not have
    boundary_out = [name for name in dict.fromkeys(n for node in nodes for n in node.output if n)
                    if name not in read_inside]
    unknown = [name for name in [*boundary_in, *boundary_out] if name not in shapes or name not in float_tensors]
    if unknown:
        raise ProbeError(f"boundary tensors {unknown} have no static shape or are not float")
    opset = next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))
    model_ends = {value.name for value in [*model.graph.input, *model.graph.output]}
    probe = Probe(number, key, origin, opset, inputs={renamed[name]: shapes[name] for name in boundary_in},
                  outputs={renamed[name]: shapes[name] for name in boundary_out},
                  own=frozenset(renamed[name] for name in [*centre.input, *centre.output] if name),
                  edge=any(name in model_ends for node in neighbourhood(model, centre, 1, constants)
                           for name in [*node.input, *node.output]))
    for index, node in enumerate(nodes):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = tag if node is centre else f"{tag}_n{index}"
        copy.input[:] = [renamed.get(name, name) for name in node.input]
        copy.output[:] = [renamed[name] if name else name for name in node.output]
        probe.nodes.append(copy)
    probe.initializers = [numpy_helper.from_array(np.asarray(constants[name]), renamed[name])
                          for name in renamed if name in constants]
    alone = _graph([probe])
    cut = next(node for node in alone.graph.node if node.name == tag)
    own = signature(cut, static_shapes(alone, constants=False), constant_values(alone.graph))
    if own != key:
        raise ProbeError(f"the probe's own signature is {own!r}")
    return probe


def _graph(probes: list[Probe]):
    """One ONNX graph of the probes as independent branches."""
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
              for probe in probes for name, shape in probe.inputs.items()]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
               for probe in probes for name, shape in probe.outputs.items()]
    graph = helper.make_graph([node for probe in probes for node in probe.nodes], "placement_probes", inputs,
                              outputs, [tensor for probe in probes for tensor in probe.initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", max(p.opset for p in probes))])
    model.ir_version = 8  # what the toolkits' onnx 1.16 and onnxruntime read
    return model


def attribute(cpu_ops: list[dict], probes: list[Probe]) -> tuple[dict[int, list[str]], list[str]]:
    """({probe number: the op types of its node's CPU layers}, [CPU layers that name no probe, or several]) from
    `built_cpu_ops` entries; a layer of a neighbour alone is neither, nor a Reshape of unit axes at a probe on the
    model's edge: the glue at the model's own input or output, which a build of the model counts apart as I/O (its
    layer table finds it by place, before the first or after the last layer, and the branches of a probe graph
    interleave)."""
    by_number = {probe.number: probe for probe in probes}
    owned: dict[int, list[str]] = {}
    unclear = []
    for op in cpu_ops:
        parts = [(int(number), kind, index) for number, kind, index in PROBE_PART.findall(op["name"])]
        numbers = {number for number, _, _ in parts} & set(by_number)
        if len(numbers) != 1:
            unclear.append(f"{op['type']}:{op['name']}")
            continue
        probe = by_number[numbers.pop()]
        if op["unit_axes_only"] and probe.edge:
            continue
        if any(not kind or f"probe{probe.number}_{kind}{index}" in probe.own for _, kind, index in parts):
            owned.setdefault(probe.number, []).append(op["type"])
    return owned, unclear


def probes_cpu_ops(probes: list[Probe], target: str, toolkit: str, work: Path) -> tuple[list[dict] | None, str]:
    """`built_cpu_ops` of the probes' graph (written with random self-check inputs under `work`)."""
    import onnx

    name = "probes_" + "_".join(str(probe.number) for probe in probes)
    if len(name) > 60:
        name = f"probes_{probes[0].number}_to_{probes[-1].number}"
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    onnx_path, selfcheck = folder / f"{name}.onnx", folder / f"{name}.selfcheck.npz"
    onnx.save(_graph(probes), str(onnx_path))
    rng = np.random.default_rng(0)
    np.savez(selfcheck, **{input_name: rng.standard_normal(shape).astype(np.float32)
                           for probe in probes for input_name, shape in probe.inputs.items()})
    return built_cpu_ops(onnx_path, selfcheck, target, toolkit, folder / f"{toolkit}_{target}")


def built_cpu_ops(onnx_path: Path, selfcheck: Path, target: str, toolkit: str,
                  out: Path) -> tuple[list[dict] | None, str]:
    """(the CPU ops of `onnx_path` built for target/toolkit as {"name", "type", "unit_axes_only"}, where they were
    read), or (None, why the build refused it). The manifest's `ops.cpu_ops` are the build log's layer table's
    CPU compute layers, in order; the table adds their shapes (a Reshape of unit axes only is I/O glue at a
    model's edge), and stands in for the manifest when a gate failed."""
    from rkaudio.core.errors import BuildError, GateFailure
    from rkaudio.engine.build import BuildOptions, build_engine

    options = BuildOptions(target, toolkit=toolkit, max_real_time_factor=None, min_simulator_snr_db=-100,
                           max_regtask_lines=10**6, layer_table_on_failure=False)
    log = out / f"{onnx_path.stem}.build.log"
    try:
        listed = build_engine(onnx_path, out, options, selfcheck=selfcheck).manifest_data["ops"]["cpu_ops"]
        ops = _table_cpu_ops(log)
        if [op["name"] for op in listed] != [op["name"] for op in ops]:
            raise RuntimeError(f"{log}: the layer table's CPU ops are not the manifest's")
        return ops, "manifest"
    except GateFailure as failure:
        failed = ", ".join(v.name for v in failure.verdicts if not v.passed)
        try:
            return _table_cpu_ops(log), f"build log ({failed})"
        except (OSError, ValueError):
            return None, f"gate failed before the compile: {failed}"
    except BuildError as error:
        return None, f"build refused ({error.stage}): {error.reason.splitlines()[-1][:200] if error.reason else ''}"


def _table_cpu_ops(log: Path) -> list[dict]:
    from rkaudio.gates.layer_table import parse_layer_table

    def squeezed(shape):
        return [dim for dim in shape if dim != 1]

    return [{"name": layer.node, "type": layer.op_type,
             "unit_axes_only": layer.op_type == "Reshape" and bool(layer.input_shapes)
             and squeezed(layer.input_shapes[0]) == squeezed(layer.output_shape)}
            for layer in parse_layer_table(log.read_text(errors="replace")).cpu_compute]


def measure(probes: list[Probe], target: str, toolkit: str, work: Path, log=print) -> dict[int, Answer]:
    """{probe number: Answer} for one target and toolkit; probes whose answer a shared graph leaves unclear are
    built again alone, a graph the build refuses is split in halves."""
    cpu_ops, source = probes_cpu_ops(probes, target, toolkit, work)
    graph = "+".join(str(probe.number) for probe in probes)
    if cpu_ops is None:
        log(f"  {toolkit} {target} probes {graph}: {source}")
        if len(probes) == 1:
            return {probes[0].number: Answer("unresolved", detail=source, graph=graph)}
        half = len(probes) // 2  # halves: a refused probe among many costs a few builds, not one per probe
        return {**measure(probes[:half], target, toolkit, work, log),
                **measure(probes[half:], target, toolkit, work, log)}
    owned, unclear = attribute(cpu_ops, probes)
    answers = {number: Answer("cpu", layers, graph=graph) for number, layers in owned.items()}
    uncertain = [probe for probe in probes if probe.number not in owned]
    if not unclear:
        answers.update({probe.number: Answer("npu", graph=graph) for probe in uncertain})
    elif len(probes) == 1:
        answers.update({probe.number: Answer("unresolved", detail=f"CPU layers naming no probe: {unclear}",
                                             graph=graph) for probe in uncertain})
    else:
        log(f"  {toolkit} {target} probes {graph}: {unclear} name no single probe; "
            f"{len(uncertain)} probes built alone")
        for probe in uncertain:
            answers.update(measure([probe], target, toolkit, work, log))
    return answers


def explained(cpu_ops: list[dict], model, predicted: set[str]) -> tuple[list[str], list[str]]:
    """(the CPU ops of a whole-model build that no node of `predicted` explains, the nodes of `predicted` no CPU op
    names). A CPU op names the nodes whose name, or a tensor they read or write, is the longest that begins the
    op's name (the compiler names a layer after its node, or after the tensor it converts: `<tensor>_rs_pad`)."""
    keys: dict[str, set[str]] = {}
    for node in model.graph.node:
        name = node.name or node.output[0]
        for key in [node.name, *node.input, *node.output]:
            if key:
                keys.setdefault(key, set()).add(name)
    unexplained, confirmed = [], set()
    for op in cpu_ops:
        starts = [key for key in keys if op["name"].startswith(key)]
        named = keys[max(starts, key=len)] if starts else set()
        confirmed |= named & predicted
        if not named & predicted:
            unexplained.append(f"{op['type']}:{op['name']}")
    return unexplained, sorted(predicted - confirmed)


def verify(models: dict, table: dict, target: str, toolkit: str, work: Path) -> list[dict]:
    """One row per model: its whole build's CPU ops against the nodes `table` puts on the CPU."""
    import onnx

    from rkaudio.gates.placement import cpu_nodes

    rows = []
    for name, model in models.items():
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        onnx_path, selfcheck = folder / f"{name}.onnx", folder / f"{name}.selfcheck.npz"
        onnx.save(model, str(onnx_path))
        rng = np.random.default_rng(0)
        fed = {tensor.name: [dim.dim_value for dim in tensor.type.tensor_type.shape.dim]
               for tensor in model.graph.input}
        np.savez(selfcheck, **{tensor: rng.standard_normal(shape).astype(np.float32) for tensor, shape in fed.items()})
        cpu_ops, source = built_cpu_ops(onnx_path, selfcheck, target, toolkit, folder / f"{toolkit}_{target}")
        predicted = cpu_nodes(model, target, toolkit, table)
        row = {"model": name, "toolkit": toolkit, "target": target,
               "table_cpu": sum(p.where == "cpu" for p in predicted),
               "table_unmeasured": sum(p.where == "unmeasured" for p in predicted)}
        if cpu_ops is None:
            rows.append({**row, "built_cpu": None, "missed": source, "not_built": ""})
            continue
        missed, not_built = explained(cpu_ops, model, {p.node_name for p in predicted if p.where == "cpu"})
        rows.append({**row, "built_cpu": len(cpu_ops), "missed": ", ".join(missed),
                     "not_built": ", ".join(not_built)})
    return rows


def other_radius(measured: dict[int, Answer], found: list, target: str, toolkit: str, radius: int,
                 work: Path) -> dict[int, Answer]:
    """Probes the build refused (the 2.5.0 compiler's attention fusion fails on an attention block cut in two; the
    rk3576 compilers die of SIGILL on some neighbourhoods of wav2vec2's feature extractor) measured again alone with
    another neighbourhood: twice the radius first (the whole block, or the model's input, inside), then halved down
    to 0 (a smaller one misses fusions: an Erf alone is a CPU op, a GELU's is not); their answers say which."""
    answers = {}
    for number, answer in measured.items():
        if answer.where != "unresolved" or not answer.detail.startswith("build refused"):
            continue
        key, model_name, node, model = found[number]
        for fallback in [radius * 2, *sorted({radius // 2, radius // 4, 0}, reverse=True)]:
            try:
                probe = make_probe(number, key, f"{model_name}:{node.name}", node, model, fallback)
            except ProbeError:
                continue
            again = measure([probe], target, toolkit, work / f"radius{fallback}", log=lambda line: None)[number]
            if again.where != "unresolved":
                again.detail = f"radius {fallback}: the build refused radius {radius}, {answer.detail}"
                answers[number] = again
                break
    return answers


def chunks(probes: list[Probe], size: int) -> list[list[Probe]]:
    """Probes in graphs of at most `size`, one opset per graph (a graph has one opset import)."""
    by_opset: dict[int, list[Probe]] = {}
    for probe in probes:
        by_opset.setdefault(probe.opset, []).append(probe)
    return [group[start:start + size] for group in by_opset.values() for start in range(0, len(group), size)]


def table_json(answers: dict, probes: dict, not_probed: dict, models: list[str], per_model: dict,
               radius: int) -> dict:
    """The placement table (rkaudio/gates/placement.py's docstring) from {(toolkit, target): {number: Answer}}.
    A signature is "cpu" where any model's probe of it kept a CPU op, "npu" where every probe that built says NPU;
    `notes` says where its probes disagree, gave no answer, or were measured at a smaller radius."""
    from rkaudio.core.contract import producer_info

    where, layers, notes, unresolved = {}, {}, {}, {}
    for (toolkit, target), found in sorted(answers.items()):
        by_signature: dict[str, list] = {}
        for number, answer in found.items():
            by_signature.setdefault(probes[number].signature, []).append((probes[number].origin, answer))
        for key, reason in not_probed.items():
            by_signature.setdefault(key, []).append(("", Answer("unresolved", detail=f"not probed: {reason}")))
        for key, measured in sorted(by_signature.items()):
            kinds = {answer.where for _, answer in measured}
            if kinds == {"unresolved"}:
                unresolved.setdefault(toolkit, {}).setdefault(target, {})[key] = "; ".join(
                    f"{origin}: {answer.detail}" if origin else answer.detail for origin, answer in measured)
                continue
            where.setdefault(toolkit, {}).setdefault(target, {})[key] = "cpu" if "cpu" in kinds else "npu"
            if "cpu" in kinds:
                layers.setdefault(toolkit, {}).setdefault(target, {})[key] = sorted(
                    {layer for _, answer in measured for layer in answer.cpu_layers})
            if len(kinds) > 1 or any(answer.detail for _, answer in measured):
                notes.setdefault(toolkit, {}).setdefault(target, {})[key] = "; ".join(
                    f"{answer.where} in {origin}" + (f" ({answer.detail})" if answer.detail else "")
                    for origin, answer in measured)
    return {
        "regenerate": REGENERATE,
        "about": "signature -> where the target runs it, measured by bench/placement.py; "
                 "read by rkaudio.gates.placement (its docstring states the format)",
        "measured": {"at": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "git": producer_info()["git"],
                     "models": models, "signatures_per_model": per_model,
                     "how": f"each signature probed in each model that holds it: its first node there and the nodes "
                            f"up to {radius} data edges away, cut at the model's shapes, built by "
                            "rkaudio.engine.build.build_engine; the manifest's CPU ops mapped back to the node by name "
                            "(bench/placement.py)"},
        "toolkits": where,
        "cpu_layers": layers,
        "notes": notes,
        "unresolved": unresolved,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    import run
    from rkaudio.gates.placement import TABLE_FILE
    from tests.speech_models import MODELS

    parser = run.parser(__file__, __doc__)
    parser.add_argument("--models", nargs="+", default=list(MODELS), metavar="NAME_OR_ONNX",
                        help="models of tests/speech_models.py (reduced size) or ONNX files (default: every model)")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    parser.add_argument("--toolkits", nargs="+", default=list(TOOLKITS), choices=TOOLKITS)
    parser.add_argument("--radius", type=int, default=5, help="data edges of neighbourhood kept around each node")
    parser.add_argument("--probes-per-graph", type=int, default=12, metavar="N")
    parser.add_argument("--work", type=Path, help="keep the probe graphs and builds here (default: a temporary dir)")
    parser.add_argument("--write-table", action="store_true", help=f"rewrite {TABLE_FILE.name} with this run")
    parser.add_argument("--verify", action="store_true",
                        help="also build each model whole and name the CPU ops the table misses either way")
    options = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-placement-") as scratch:
        work = options.work or Path(scratch)
        models = load_models(options.models, work / "models")
        found, per_model = first_nodes(models)
        probes, not_probed = {}, {}
        for number, (key, model_name, node, model) in enumerate(found):
            try:
                probes[number] = make_probe(number, key, f"{model_name}:{node.name}", node, model, options.radius)
            except ProbeError as error:
                not_probed[key] = f"{model_name}:{node.name}: {error}"
        print(f"{len({entry[0] for entry in found})} signatures, {len(probes)} probes: "
              f"{', '.join(f'{name} ({count})' for name, count in per_model.items())}")
        answers, refused = {}, {toolkit: set() for toolkit in options.toolkits}
        for toolkit in options.toolkits:
            for target in options.targets:
                started = time.time()
                # a probe this toolkit refused for another target is built alone at once rather than found again by
                # halving its graph
                shared = [probe for number, probe in probes.items() if number not in refused[toolkit]]
                alone = [[probe] for number, probe in probes.items() if number in refused[toolkit]]
                measured = {}
                for group in chunks(shared, options.probes_per_graph) + alone:
                    measured.update(measure(group, target, toolkit, work / "builds"))
                refused[toolkit] |= {number for number, answer in measured.items()
                                     if answer.detail.startswith("build refused")}
                measured.update(other_radius(measured, found, target, toolkit, options.radius, work / "other_radius"))
                answers[(toolkit, target)] = measured
                print(f"{toolkit} {target}: {sum(a.where == 'cpu' for a in measured.values())} CPU of "
                      f"{len(measured)} ({time.time() - started:.0f} s)")
        table = table_json(answers, probes, not_probed, list(models), per_model, options.radius)
        rows = [{"kind": "probe", "signature": probes[number].signature, "toolkit": toolkit, "target": target,
                 "where": answer.where, "cpu_layers": ", ".join(answer.cpu_layers), "detail": answer.detail,
                 "graph": answer.graph, "from": probes[number].origin}
                for (toolkit, target), cell in answers.items() for number, answer in sorted(cell.items())]
        rows += [{"kind": "probe", "signature": key, "where": "not probed", "detail": reason}
                 for key, reason in not_probed.items()]
        if options.verify:
            rows += [{"kind": "model", **row} for toolkit in options.toolkits for target in options.targets
                     for row in verify(models, table, target, toolkit, work / "whole")]
    if options.write_table:
        TABLE_FILE.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {TABLE_FILE}")
    return rows


if __name__ == "__main__":
    import run

    run.script(__file__)
