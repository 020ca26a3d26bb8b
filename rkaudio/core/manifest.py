"""The manifest written beside every engine, and the exec_plan fragment that selects it at runtime.

Everything comes from the ONNX contract (rkaudio/core/contract.py) and the build's own measurements;
nothing here is family-specific. Every manifest written is checked against its model first
(rkaudio/core/manifest_model.py)."""
from __future__ import annotations

import json
from pathlib import Path

from rkaudio.core.contract import producer_info
from rkaudio.core.errors import SetupError
from rkaudio.core.manifest_model import validate_manifest
from rkaudio.board.contract import EngineContract
from rkaudio.board.files import MANIFEST_SUFFIX, sha256_file
from rkaudio.board.numeric import json_safe


def file_entry(path: Path, manifest_dir: Path) -> dict:
    """path (relative to the manifest's folder when inside it, else absolute), sha256, bytes."""
    path = Path(path).resolve()
    shown = path.relative_to(manifest_dir.resolve()) if manifest_dir.resolve() in path.parents else path
    return {"path": str(shown), "sha256": sha256_file(path), "bytes": path.stat().st_size}


def normalized_sha256(rknn_path: Path, producer_git: str | None) -> str:
    """The digest two builds of one graph share whatever commit produced them: the engine's sha256 with every copy
    of `producer_git` (the commit `rkaudio.toolkit.session.custom_string` embeds) written as '0's of its length. Builds are
    otherwise byte-identical (the compiler child's heap is filled with a fixed byte: rkaudio/toolkit/session.py,
    MALLOC_PERTURB_), so nothing else is masked. A clean and a +dirty commit differ in length, so their engines do."""
    import hashlib

    data = Path(rknn_path).read_bytes()
    if producer_git and producer_git != "unknown":
        data = data.replace(producer_git.encode(), b"0" * len(producer_git.encode()))
    return hashlib.sha256(data).hexdigest()


def engine_entry(rknn_path: Path, manifest_dir: Path, producer_git: str | None) -> dict:
    """The engine's file entry plus `normalized_sha256` (the digest with the producer commit masked)."""
    entry = file_entry(rknn_path, manifest_dir)
    return {**entry, "normalized_sha256": normalized_sha256(rknn_path, producer_git)}


def exec_plan_fragment(contract: EngineContract, rknn_name: str) -> dict:
    """`{option: {component: {"impl": "rknn", "artifacts": {role: rknn_name}, "params"?: ...}}}` for the
    consumer's session option; `{}` when the ONNX carries no rkaudio contract."""
    if not contract.exec_plan_option or not contract.component:
        return {}
    # an engine of several shape sets fills each of its sets' roles (one ladder role: named once)
    roles = dict.fromkeys(view.role or "main" for view in contract.views())
    entry = {"impl": "rknn", "artifacts": {role: rknn_name for role in roles}}
    if contract.exec_params is not None:
        entry["params"] = contract.exec_params
    return {contract.exec_plan_option: {contract.component: entry}}


def cpu_op_price(op: dict) -> str:
    """" (12 KB, 0.05 ms predicted)" for a priced CPU op of a manifest (older manifests: "")."""
    if op.get("rw_kb") is None:
        return ""
    predicted = op.get("predicted_ms")
    return f" ({op['rw_kb']:,.0f} KB" + (f", {predicted:.3g} ms predicted)" if predicted is not None else ")")


def shape_set_entry(entry: dict, inputs: list, outputs: list, regtask_report, table, predicted_board_ms,
                    ops: dict) -> dict:
    """One shape set of a dynamic engine in its manifest: its tensors as fed and returned, the contract fields it
    stands for, and its own figures from its own layer table (the compiler builds one graph per set)."""
    return {"inputs": list(inputs), "outputs": list(outputs), "contract": entry["contract"],
            "regtask": regtask_report.to_json(), "ops": ops, "est_cycles": table.est_cycles,
            "rw_kb": table.rw_kb, "weight_bytes": table.weight_bytes, "internal_bytes": table.internal_bytes,
            "predicted_board_ms": predicted_board_ms}


def build_manifest(*, contract: EngineContract, target: str, toolkit: str, inputs, outputs, onnx_path: Path,
                   rknn_path: Path, build_log: Path, regtask_report, table, ops: dict, verdicts, simulator: dict,
                   build_stats: dict | None = None, predicted_board_ms: dict | None = None,
                   shape_sets: list | None = None) -> dict:
    """The manifest of one engine (see HACKING.md); `inputs`/`outputs` are the tensor entries a caller feeds and
    gets ({"name", "shape", "dtype"}: `rkaudio.core.contract.fed_inputs`), `table` a LayerTable, `ops` its op counts
    with each CPU op priced (rkaudio.gates.board_time.priced_ops), `predicted_board_ms`
    rkaudio.gates.board_time.predict's figure (None: no constants for the target). An engine of several shape sets gives
    the figures of its largest set there and every set's in `shape_sets` (`shape_set_entry`)."""
    producer = contract.producer or producer_info()
    rknn_name, manifest_dir = Path(rknn_path).name, Path(rknn_path).parent
    return json_safe({
        "family": contract.family,
        "component": contract.component,
        "role": contract.role,
        "target": target,
        "toolkit_version": toolkit,
        "producer_version": producer.get("rkaudio"),
        "producer_git": producer.get("git"),
        "producer": producer,
        "inputs": list(inputs),
        "outputs": list(outputs),
        "onnx": file_entry(onnx_path, manifest_dir),
        "rknn": engine_entry(rknn_path, manifest_dir, producer.get("git")),
        "build": build_stats or {},
        "build_log": Path(build_log).name,
        "regtask": regtask_report.to_json(),
        "ops": ops,
        "engine_io": table.io_dtypes(),
        "est_cycles": table.est_cycles,
        "rw_kb": table.rw_kb,
        "weight_bytes": table.weight_bytes,
        "internal_bytes": table.internal_bytes,
        "predicted_board_ms": predicted_board_ms,
        "simulator": simulator,
        "gates": [verdict.to_json() for verdict in verdicts],
        "exec_plan": exec_plan_fragment(contract, rknn_name),
        "contract": contract.to_json(),
        **({"shape_sets": shape_sets} if shape_sets else {}),
    })


def manifest_text(data: dict) -> str:
    """The file of the manifest `data`, once it validates (`rkaudio.core.manifest_model.validate_manifest`: a
    manifest that does not is a bug of its writer, a ValueError naming each field); its keys in their order."""
    return json.dumps(validate_manifest(data), indent=2, sort_keys=False) + "\n"


def write_manifest(path: Path, data: dict) -> Path:
    Path(path).write_text(manifest_text(data))
    return Path(path)


def manifest_path_for(engine_or_manifest: Path) -> Path:
    """`x.manifest.json` for `x.rknn` (or the path itself when it already is a manifest)."""
    path = Path(engine_or_manifest)
    if path.name.endswith(MANIFEST_SUFFIX):
        return path
    return path.with_name(path.stem + MANIFEST_SUFFIX)


def read_manifest(engine_or_manifest: Path) -> dict:
    path = manifest_path_for(engine_or_manifest)
    if not path.is_file():
        raise SetupError(f"no manifest at {path}: engines built by `convert build` have one beside the .rknn")
    return json.loads(path.read_text())


def engine_contract(engine_path: Path) -> EngineContract:
    """The contract of an engine file: an .onnx's own (its metadata), or a .rknn's from the manifest beside it;
    refused in one line when the file or its manifest is missing or unreadable, or the ONNX carries none."""
    from rkaudio.core.contract import contract_of
    from rkaudio.core.onnx_graph import load_model  # onnx only when an ONNX is read

    path = Path(engine_path)
    if path.suffix == ".onnx":
        contract = contract_of(load_model(path, "engine"))
        if contract.empty:
            raise SetupError(f"{path} carries no rkaudio contract: give an ONNX written by `convert <family> "
                             "--skip-rknn`")
        return contract
    if not path.is_file():
        raise SetupError(f"no engine at {path}")
    manifest = manifest_path_for(path)
    if not manifest.is_file():
        raise SetupError(f"no manifest {manifest} beside {path}: the engine's contract is read from it")
    try:
        return EngineContract.from_json(json.loads(manifest.read_bytes().decode("utf-8"))["contract"])
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise SetupError(f"{manifest} is not an engine manifest with a contract ({type(error).__name__}: "
                         f"{error}); rebuild the engine") from None


def board_time_line(prediction: dict | None) -> str:
    """One line for a manifest's `predicted_board_ms` (rkaudio/gates/board_time.py): the total and its terms."""
    if not prediction:
        return "predicted board time: none (no board-time constants for this SoC, or built before the model)"
    terms = ", ".join(f"{name} {ms:,.1f}" for name, ms in prediction["terms"].items())
    computed = f"; {prediction['computed_by']}" if prediction.get("computed_by") else ""
    return f"predicted board time: {prediction['ms']:,.1f} ms per call ({terms}; {prediction['basis']}{computed})"


def worst_overflow(regtask: dict) -> str:
    """A manifest's `regtask` section's worst line in words, e.g. `worst 2.00x its field (value 0x3fe0, limit
    0x1fff, target lite offset 0x4038)`; "" without REGTASK lines. Each field has one limit, so the field with the
    largest worst_value/limit holds the worst line (its ratio is `worst_ratio`)."""
    if not regtask.get("fields"):
        return ""
    worst = max(regtask["fields"], key=lambda entry: entry["worst_value"] / entry["limit"])
    return (f"worst {worst['worst_value'] / worst['limit']:.2f}x its field (value {worst['worst_value']:#x}, "
            f"limit {worst['limit']:#x}, target {worst['target']} offset {worst['offset']})")


def regtask_line(regtask: dict, unit: str) -> str:
    """`<lines> <unit>`, then the worst overflow when there is one."""
    worst = worst_overflow(regtask)
    return f"{regtask.get('lines')} {unit}" + (f", {worst}" if worst else "")


def summary_lines(data: dict) -> list[str]:
    """Human summary of a manifest for `convert inspect`."""
    ops, regtask = data.get("ops", {}), data.get("regtask", {})
    lines = [
        f"{data['rknn']['path']}: {data.get('family')}/{data.get('component')} role {data.get('role')} "
        f"for {data['target']} (rknn-toolkit2 {data['toolkit_version']}, rkaudio {data.get('producer_version')} "
        f"{data.get('producer_git')})",
        "  inputs:  " + ", ".join(f"{t['name']} {t['shape']} {t['dtype']}" for t in data["inputs"]),
        "  outputs: " + ", ".join(f"{t['name']} {t['shape']} {t['dtype']}" for t in data["outputs"]),
        "  engine holds: " + ", ".join(f"{kind} {'/'.join(sorted(set(dtypes.values()))) or '?'}"
                                       for kind, dtypes in data.get("engine_io", {}).items()),
        f"  bytes: rknn {data['rknn']['bytes']:,}  onnx {data['onnx']['bytes']:,}  weight {data['weight_bytes']:,}  "
        f"internal {data['internal_bytes']:,}",
        f"  regtask: {regtask_line(regtask, 'lines')}",
        f"  ops: {ops.get('npu')} NPU, {ops.get('cpu')} CPU compute, {ops.get('cpu_boundary')} CPU I/O glue; "
        f"est. cycles {data['est_cycles']:,}, traffic {data['rw_kb']:,.0f} KB",
    ]
    lines += [f"    cpu: {op['type']} {op['name']}" + cpu_op_price(op) for op in ops.get("cpu_ops", [])]
    lines.append("  " + board_time_line(data.get("predicted_board_ms")))
    for number, entry in enumerate(data.get("shape_sets", [])):
        shapes = ", ".join(f"{t['name']} {t['shape']}" for t in entry["inputs"]
                           if len({tuple(i["shape"]) for s in data["shape_sets"] for i in s["inputs"]
                                   if i["name"] == t["name"]}) > 1)
        predicted = (entry.get("predicted_board_ms") or {}).get("ms")
        lines.append(f"  shape set {number} (role {EngineContract.from_json(entry['contract']).role}): {shapes}; "
                     f"{entry['ops']['cpu']} CPU ops, {regtask_line(entry['regtask'], 'REGTASK lines')}, est. cycles "
                     f"{entry['est_cycles']:,}, internal {entry['internal_bytes']:,}"
                     + (f", predicted {predicted:,.1f} ms" if predicted else ""))
    lines.append("  gates:")
    for gate in data.get("gates", []):
        mark = "PASS" if gate["passed"] else "FAIL"
        detail = f"  {gate['detail']}" if gate.get("detail") else ""
        value, threshold = (f"{x:.4g}" if isinstance(x, (int, float)) else x for x in (gate["value"], gate["threshold"]))
        lines.append(f"    [{mark}] {gate['name']}: {value} {gate['unit']} (threshold {threshold}){detail}")
    if data.get("exec_plan"):
        lines.append("  exec_plan: " + json.dumps(data["exec_plan"], separators=(",", ":")))
    return lines
