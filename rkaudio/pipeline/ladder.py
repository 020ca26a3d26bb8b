"""`--ladder dynamic`: the engines of a ladder (one fixed-shape export per rung, bucket or role) become one export
that the toolkit compiles once for all their shapes (`config(dynamic_input=...)`), the weights stored once.

The family exports its rungs as always; `dynamic_ladder` merges those whose role its component declares a ladder
(`Component.ladder`) into one shape-generic ONNX (`rkaudio.surgery.graph.shape_generic`), gates that the merged graph
computes exactly what each rung's graph computes on its self-check, and writes the contract's `shape_sets` (each
set's input and output shapes and the contract fields that differ between rungs: role, ladder key, length), so
the build, the manifest, the exec_plan and the runtime read the sets from the engine and restate nothing."""
from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Callable

from rkaudio.pipeline.exported import Exported, record_export
from rkaudio.core.contract import contract_of
from rkaudio.core.errors import SetupError
from rkaudio.core.paths import engine_name, reference_path
from rkaudio.board.contract import EngineContract
from rkaudio.board.ladder import DepthSplit
from rkaudio.board.shapes import keyed
from rkaudio.board.verdict import Verdict, at_most
from rkaudio.host.exec_plan import role_matches
from rkaudio.toolkit.versions import DEFAULT_TOOLKIT

# The contract fields every rung carries on its own and the merged engine does not take from one rung.
NOT_PER_SET = ("producer", "export_verdicts", "reference_onnx")
LEAN_MIN_ELEMENTS = 1 << 16  # an initializer this large is a weight or a table, never a shape: set aside to merge
EXACT_LIMIT = 1e-6  # max|d| / max|reference| of the merged graph against each rung's own graph


def _merged_stem(stems: list[str]) -> str:
    """The rungs' common stem without its trailing length spelling (`cosyvoice3_flow_s24` .. -> `cosyvoice3_flow`),
    plus `_ladder`."""
    common = re.sub(r"_[A-Za-z]?\d*$", "", os.path.commonprefix(stems)) or "engine"
    return f"{common}_ladder"


def _shapes(model, weights: dict) -> tuple[dict, dict]:
    """The input (the weights set aside excluded) and output shapes of one rung's graph."""
    from rkaudio.toolkit.session import graph_io

    inputs, outputs = graph_io(model)
    return ({s.name: list(s.shape) for s in inputs if s.name not in weights},
            {s.name: list(s.shape) for s in outputs})


def _lean_rungs(paths: list[Path]) -> tuple[list, dict]:
    """(the rungs' graphs, the weights set aside): loaded one at a time, every large initializer that all rungs
    hold byte-identical set aside once as a graph input (`rkaudio.core.onnx_graph.weights_aside`; only the first rung's
    copy is kept). Held whole, the merge took ~25x one rung's weight bytes (a 256 MiB stand-in, five rungs):
    past 30 GB for CosyVoice3's five 1.3 GB rungs."""
    import numpy as np

    from rkaudio.core.onnx_graph import load_model, weights_aside, weights_back

    graphs, first, differing = [], {}, set()
    for path in paths:
        model = load_model(path)
        large = {t.name: t for t in model.graph.initializer if int(np.prod(t.dims)) >= LEAN_MIN_ELEMENTS}
        if not graphs:
            first = large  # the first rung's tensors: the merged graph's weights (they keep that rung loaded)
        differing |= set(first) ^ set(large)
        differing |= {name for name, tensor in large.items() if name in first and name not in differing
                      and tensor.SerializeToString() != first[name].SerializeToString()}
        graphs.append(weights_aside(model, set(large) - differing)[0])
        del model, large
    # a tensor found to differ only at a later rung goes back into the earlier graphs (it equals the first's there)
    back = {name: first[name] for name in differing if name in first}
    for graph in graphs:
        weights_back(graph, {name: tensor for name, tensor in back.items()
                             if any(value.name == name for value in graph.graph.input)})
    return graphs, {name: tensor for name, tensor in first.items() if name not in differing}


def _set_fields(contracts: list[EngineContract]) -> list[dict]:
    """Each rung's contract fields that differ between the rungs, as its shape set's `contract`: the JSON a view of
    the merged engine lays over the engine's own contract (`EngineContract.views`)."""
    rungs = [contract.to_json() for contract in contracts]
    keys = {key for rung in rungs for key in rung if key not in NOT_PER_SET}
    # the role always: it is what the exec_plan and the runtime's loops pick a set by
    differing = sorted({"role"} | {key for key in keys
                                   if len({json.dumps(rung.get(key), sort_keys=True) for rung in rungs}) > 1})
    return [{key: rung.get(key) for key in differing} for rung in rungs]


def _with_weights(graph, weights: dict):
    """A copy of a lean rung's graph with its weights back in (`weights_back` works in place)."""
    import onnx

    from rkaudio.core.onnx_graph import weights_back

    whole = onnx.ModelProto()
    whole.CopyFrom(graph)
    return weights_back(whole, weights)


def exactness_verdict(generic, rungs: list[Exported], graphs: list, weights: dict) -> Verdict:
    """The merged graph against each rung's own graph (`graphs`, the ONNX models the merge started from, in rung
    order, their shared `weights` set aside: `_lean_rungs`) on that rung's self-check (onnxruntime fp32): the worst
    max|d| relative to the rung's output scale. Anything but rounding noise means the merge changed the maths."""
    import numpy as np

    from rkaudio.host.backends import OnnxBackend

    worst, where = 0.0, ""
    with OnnxBackend(generic) as merged:
        for record, graph in zip(rungs, graphs):
            with np.load(record.selfcheck) as data:
                feeds = {name: data[name] for name in data.files}
            with OnnxBackend(_with_weights(graph, weights)) as own:  # one rung's weights in memory at a time
                expected = own.run(feeds)
            got = merged.run(feeds)
            for name, value in expected.items():
                scale = float(np.max(np.abs(value))) or 1.0
                error = float(np.max(np.abs(got[name].astype(np.float64) - value))) / scale
                if error >= worst:
                    worst, where = error, f"{record.onnx.name} {name}"
    return at_most("shape_generic_exact", worst, EXACT_LIMIT, "max|d|/max|ref|",
                   f"one graph for {len(rungs)} shape sets against each set's own graph (worst: {where})")


def merge_rungs(rungs: list[Exported], say: Callable[[str], None] = print, toolkit: str = DEFAULT_TOOLKIT) -> Exported:
    """One shape-generic export of `rungs` (in set order), beside them: its ONNX, its keyed self-check
    (`<input>@<set>`), its fp32 twin when the rungs have one, and the end-to-end goldens renamed to it. For a
    `toolkit` that runs a dynamic engine's last-axis means on the CPU, the rungs' means are written as MatMuls
    before the merge: the exactness gate judges the merge alone (those rewritten rungs against the merged graph;
    the means' new fp32 summation order alone put the real-shape Qwen3 step at 9.1e-7 of its 1e-6 against the
    rungs as exported); the simulator gate judges the engine against the fp32 twin where the rungs have one (its
    means kept as ReduceMeans)."""
    import numpy as np
    import onnx

    from rkaudio.core.contract import set_contract
    from rkaudio.core.onnx_graph import weights_back
    from rkaudio.surgery.graph.mean_as_matmul import mean_as_matmul
    from rkaudio.surgery.graph.shape_generic import NotOneGraph, shape_generic
    from rkaudio.toolkit.session import DYNAMIC_MEANS_ON_CPU

    models, weights = _lean_rungs([r.onnx for r in rungs])
    if toolkit in DYNAMIC_MEANS_ON_CPU:
        models = [mean_as_matmul(model) for model in models]
    contracts = [contract_of(m) for m in models]
    out_dir = rungs[0].onnx.parent
    onnx_path = out_dir / f"{_merged_stem([r.onnx.stem for r in rungs])}.onnx"
    try:
        generic = shape_generic(models)
        twin = None
        if all(r.reference is not None for r in rungs):
            twin_models, twin_weights = _lean_rungs([r.reference for r in rungs])
            twin = weights_back(shape_generic(twin_models), twin_weights)
    except NotOneGraph as error:
        raise SetupError(f"--ladder dynamic: the rungs {[r.onnx.name for r in rungs]} are not one graph at several "
                         f"shapes: {error}") from None
    sets = []
    for model, fields in zip(models, _set_fields(contracts)):
        inputs, outputs = _shapes(model, weights)
        sets.append({"inputs": inputs, "outputs": outputs, "contract": fields})
    # the last rung's contract (the largest), without what only a rung's own export says
    contract = contracts[-1].replace(shape_sets=sets, ladder="dynamic", reference_onnx=None, export_verdicts=None)
    onnx.save(weights_back(set_contract(generic, contract), weights), str(onnx_path))
    feeds = {}
    for number, record in enumerate(rungs):
        with np.load(record.selfcheck) as data:
            feeds.update({keyed(name, number): data[name] for name in data.files})
    reference = None
    if twin is not None:
        reference = reference_path(onnx_path)
        onnx.save(twin, str(reference))
    verdicts = list(dict.fromkeys(v for r in rungs for v in r.verdicts))
    verdicts.append(exactness_verdict(onnx_path, rungs, models, weights))
    record = record_export(onnx_path, verdicts, feeds=feeds, reference=reference)
    say(f"  merged {len(rungs)} rungs into {onnx_path.name}: one engine for shape sets "
        + ", ".join(str({name: shape for name, shape in s["inputs"].items()
                         if len({tuple(x["inputs"][name]) for x in sets}) > 1}) for s in sets))
    return replace(record, end_to_end=_renamed_goldens(rungs, onnx_path))


def _renamed_goldens(rungs: list[Exported], merged: Path) -> Path | None:
    """The end-to-end goldens that named the rungs now name the merged engine once (its views stand for them)."""
    names = {r.onnx.name for r in rungs}
    engines = {engine_name(r.onnx) for r in rungs}
    found = None
    for spec_path in dict.fromkeys(r.end_to_end for r in rungs if r.end_to_end is not None):
        spec = json.loads(Path(spec_path).read_text())
        spec["onnx"] = list(dict.fromkeys(merged.name if n in names else n for n in spec["onnx"]))
        spec["engines"] = list(dict.fromkeys(engine_name(merged) if n in engines else n for n in spec["engines"]))
        Path(spec_path).write_text(json.dumps(spec, indent=2) + "\n")
        found = spec_path
    return found


def dynamic_ladder(exported: list[Exported], roles: tuple[str, ...], say: Callable[[str], None] = print,
                   toolkit: str = DEFAULT_TOOLKIT) -> list:
    """`exported` with the records whose role matches `roles` (`<n>` matches digits) merged into one, in ladder
    order (their `ladder_key`, then export order); a rung split by depth (contract `chain`) merges part by part.
    The other records are kept as they are. `toolkit` is the one that will compile the merged graph."""
    groups: dict = {}
    for position, record in enumerate(exported):
        contract = contract_of(record.onnx)
        if any(role_matches(pattern, contract.role) for pattern in roles):
            groups.setdefault(DepthSplit.of(contract).part, []).append((contract.ladder_order, position, record))
    if not groups:
        raise SetupError(f"--ladder dynamic: no exported engine fills the ladder roles {list(roles)}")
    merged_at, merged = {}, {}
    for part, members in groups.items():
        members.sort(key=lambda item: (item[0], item[1]))
        if len(members) < 2:
            raise SetupError(f"--ladder dynamic needs at least two rungs; this export has one "
                             f"({members[0][2].onnx.name}): build it static")
        positions = [position for _, position, _ in members]
        merged_at[min(positions)] = merge_rungs([record for _, _, record in members], say, toolkit)
        merged.update(dict.fromkeys(positions))
    return [merged_at[position] if position in merged_at else record
            for position, record in enumerate(exported) if position in merged_at or position not in merged]
