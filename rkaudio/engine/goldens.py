"""The self-test kit's goldens, written at build time beside the engines (`selftest/`: `golden.npz`, `index.json`):
record each end-to-end golden over onnxruntime fp32 (`record_end_to_end`), write every engine's self-check and
simulator outputs with the recorded loops (`write_goldens`), and merge the kits of a package's components
(`merge_goldens`). `rkaudio.pipeline.pipeline` writes them at each build; packaging
(`rkaudio.release.kit.add_to_package`) copies them into the package.

The board side that reads them is `rkaudio/board/golden.py` and `rkaudio/board/selftest.py`."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from rkaudio.core.errors import PackageError
from rkaudio.core.paths import end_to_end_inputs, engine_name
from rkaudio.board.contract import EngineContract
from rkaudio.board.files import KIT_DIR
from rkaudio.board.shapes import SET_KEY, of_set


@dataclass
class Recording:
    """One end-to-end golden run on the host in fp32: the loop's inputs, every engine call, its final outputs."""

    spec: dict
    inputs: dict
    calls: list  # (engine file name, feeds, outputs), in call order
    outputs: dict


def tree_bytes(path: Path) -> int:
    path = Path(path)
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def record_end_to_end(exported: list, say: Callable[[str], None] = print) -> list[Recording]:
    """Run each end-to-end golden that the records declare over onnxruntime fp32 (on each engine's fp32 twin
    where it has one), recording every engine call. A golden whose engines are not all among `exported` (an
    `--onnx` build of one engine) is skipped with a line."""
    from rkaudio.core.contract import contract_of
    from rkaudio.host.backends import OnnxBackend
    from rkaudio.board.golden import CallLog, EnginePool, run_loop

    by_name = {engine_name(r.onnx): r for r in exported}
    recordings = []
    for spec_path in dict.fromkeys(r.end_to_end for r in exported if r.end_to_end is not None):
        spec = json.loads(Path(spec_path).read_text())
        missing = [name for name in spec["engines"] if name not in by_name]
        if missing:
            say(f"end-to-end golden {spec['name']} skipped: it also needs {', '.join(missing)}")
            continue
        with np.load(end_to_end_inputs(spec_path)) as data:
            inputs = {key: data[key] for key in data.files}
        log = CallLog()
        entries = [(name, contract_of(by_name[name].onnx)) for name in spec["engines"]]

        def fp32(name: str):
            record = by_name[name]
            return OnnxBackend(record.reference or record.onnx)

        with EnginePool(entries, fp32, None, log) as pool:
            outputs = run_loop(spec["loop"], pool.engines, inputs, spec["params"])
        recordings.append(Recording(spec, inputs, log.calls, outputs))
    return recordings


def calls_of(recordings: list[Recording], engine: str) -> list[tuple[dict, dict]]:
    """(feeds, fp32 outputs) of every recorded call of `engine`, in order over all recordings."""
    return [(feeds, outputs) for recording in recordings for name, feeds, outputs in recording.calls if name == engine]


class ReplayBackend:
    """Returns stored outputs in call order, whatever it is fed: the loop replayed with the simulator's
    outputs of the fp32-fed calls (teacher forcing: each call's inputs are the fp32 loop's)."""

    def __init__(self, outputs: list[dict], inputs: list[dict], output_names: list[str]):
        """`inputs`: the manifest's entries (names and the dtypes the engine is fed in)."""
        self._outputs, self.output_names = list(outputs), output_names
        self.input_names = [t["name"] for t in inputs]
        self.input_dtypes = {t["name"]: np.dtype(t["dtype"]) for t in inputs}

    def run(self, feeds: dict) -> dict:
        if not self._outputs:
            raise RuntimeError("the replayed loop made more calls than were recorded")
        return self._outputs.pop(0)

    def close(self) -> None:
        pass


def write_goldens(out_dir: Path, exported: list, results: list, recordings: list[Recording], min_snr_db: float) -> Path:
    """`out_dir/selftest/`: `golden.npz` (identical arrays once) and `index.json`. Per engine: the self-check
    inputs, the fp32 outputs, the simulator outputs. Per end-to-end golden: the loop's inputs, every call's
    engine, input digests and fp32 outputs, and the loop's final fp32 outputs, with the simulator's figure for
    the loop (the loop replayed over the simulator outputs of its fp32-fed calls)."""
    from rkaudio.board.numeric import json_safe, max_abs, snr_db
    from rkaudio.board.golden import GOLDEN_FILE, SCHEMA_VERSION, ArrayWriter, EnginePool, as_stored, digest, run_loop
    from rkaudio.board.golden import write_index

    kit_dir = Path(out_dir) / KIT_DIR
    shutil.rmtree(kit_dir, ignore_errors=True)
    kit_dir.mkdir(parents=True)
    writer = ArrayWriter()
    index = {"schema": SCHEMA_VERSION, "file": GOLDEN_FILE, "engines": [], "end_to_end": []}
    for record, result in zip(exported, results):
        manifest = result.manifest_data
        with np.load(record.selfcheck) as data:
            feeds = {key: data[key] for key in data.files}
        unstored = [name for name, value in feeds.items() if not np.array_equal(as_stored(value), value, equal_nan=True)]
        if unstored:
            raise PackageError(f"{record.selfcheck.name}: inputs {unstored} were not written by record_export in the "
                               "kit's storage form; export the ONNX again with this rkaudio")
        contract = EngineContract.from_json(manifest["contract"])
        for number, entry in enumerate(manifest.get("shape_sets") or [manifest]):  # a dynamic engine: per set
            def own(arrays: dict) -> dict:
                return of_set(arrays, number) if "shape_sets" in manifest else arrays

            set_feeds = own(feeds)
            arrays = [writer.add("input", spec["name"], set_feeds[spec["name"]]) for spec in entry["inputs"]]
            arrays += [writer.add("fp32", tensor, value) for tensor, value in own(result.reference_outputs).items()]
            arrays += [writer.add("simulator", tensor, value)
                       for tensor, value in own(result.simulator_outputs).items()]
            index["engines"].append({
                "engine": Path(result.rknn).name, "manifest": Path(result.manifest).name, "arrays": arrays,
                **({SET_KEY: number} if "shape_sets" in manifest else {}),
                "reference": f"onnxruntime fp32 on {contract.reference_onnx or manifest['onnx']['path']}",
                "simulator": own(manifest["simulator"]), "min_snr_db": min_snr_db,
                # the board-time model's figure, reported beside the measured latency: the first board run checks it
                "predicted_ms": (entry.get("predicted_board_ms") or {}).get("ms")})
    simulated = {Path(r.rknn).name: list(r.golden_simulator_outputs) for r in results}
    manifests = {Path(r.rknn).name: r.manifest_data for r in results}
    for recording in recordings:
        spec = recording.spec
        arrays = [writer.add("input", tensor, value) for tensor, value in recording.inputs.items()]
        calls = []
        for number, (engine, feeds, outputs) in enumerate(recording.calls):
            calls.append({"engine": engine, "inputs": [{"tensor": tensor, "dtype": str(np.asarray(value).dtype),
                                                        "shape": list(np.shape(value)), "sha256": digest(value)}
                                                       for tensor, value in feeds.items()]})
            arrays += [writer.add("call_output", tensor, value, call=number, engine=engine)
                       for tensor, value in outputs.items()]
        arrays += [writer.add("output", tensor, value) for tensor, value in recording.outputs.items()]
        replays = {name: ReplayBackend([simulated[name].pop(0) for _ in range(sum(c[0] == name for c in recording.calls))],
                                       manifests[name]["inputs"],
                                       [t["name"] for t in manifests[name]["outputs"]])
                   for name in spec["engines"]}
        contracts = [(name, EngineContract.from_json(manifests[name]["contract"])) for name in spec["engines"]]
        with EnginePool(contracts, replays.__getitem__) as pool:
            sim_outputs = run_loop(spec["loop"], pool.engines, recording.inputs, spec["params"])
        figures = {tensor: {"snr_db": snr_db(value, sim_outputs[tensor]), "max_abs": max_abs(value, sim_outputs[tensor]),
                            "method": "the loop replayed over the simulator outputs of its fp32-fed calls"}
                   for tensor, value in recording.outputs.items() if value.dtype.kind == "f"}
        index["end_to_end"].append({
            "name": spec["name"], "loop": spec["loop"], "params": spec["params"], "description": spec["description"],
            "engines": spec["engines"], "arrays": arrays, "calls": calls, "simulator": figures,
            "min_snr_db": min_snr_db})
    writer.save(kit_dir / GOLDEN_FILE)
    write_index(kit_dir, json_safe(index))
    return kit_dir


def merge_goldens(kits: list[Path], into: Path) -> Path:
    """One kit from the kits of a package's components (each written by `write_goldens`): their engines and
    end-to-end goldens side by side in one index, every array keyed anew (identical arrays still stored once).
    The component kits are removed."""
    from rkaudio.board.golden import GOLDEN_FILE, SCHEMA_VERSION, ArrayWriter, read_index, write_index

    writer = ArrayWriter()
    merged = {"schema": SCHEMA_VERSION, "file": GOLDEN_FILE, "engines": [], "end_to_end": []}
    for kit_dir in kits:
        index = read_index(kit_dir)
        with np.load(Path(kit_dir) / index["file"]) as data:
            for section in ("engines", "end_to_end"):
                merged[section] += [{**entry, "arrays": [writer.adopt(array, data[array["key"]])
                                                         for array in entry["arrays"]]} for entry in index[section]]
    shutil.rmtree(into, ignore_errors=True)
    Path(into).mkdir(parents=True)
    writer.save(Path(into) / GOLDEN_FILE)
    write_index(into, merged)
    for kit_dir in kits:
        shutil.rmtree(kit_dir)
    return Path(into)
