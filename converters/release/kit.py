"""The board self-test kit, host side: record the golden I/O at build time, put the kit into a package
(`selftest/`, `selftest.py`, the runtime modules it imports, copied unchanged, and `SHA256SUMS`), verify a
package against its sums and manifests, and replay the kit on the host (`convert selftest`, `convert verify`).

The board side is `runtime/selftest.py` (run there as `python3 selftest.py`) over `runtime/golden.py`."""
from __future__ import annotations

import ast
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from converters.release.package import write_file
from core.errors import PackageError, SetupError
from core.paths import KIT_DIR, REPO_ROOT, SUMS_NAME, end_to_end_inputs, engine_name, manifest_name

KIT_SCRIPT = "selftest.py"
KIT_ENTRY_MODULE = "runtime.board.selftest"
SHIPPABLE_PACKAGES = ("runtime", "core", "gates")  # numpy and the stdlib at module level (tests/structure checks)
MAX_KIT_BYTES, MIN_KIT_BUDGET_BYTES, KIT_SHARE = 20_000_000, 1_000_000, 0.05
SIMULATORS_OPEN = 4  # converter children alive at once in a host replay (each holds a compiled graph)


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


# --- recording (build time) ----------------------------------------------------------------------------------

def record_end_to_end(exported: list, say: Callable[[str], None] = print) -> list[Recording]:
    """Run each end-to-end golden that the records declare over onnxruntime fp32 (on each engine's fp32 twin
    where it has one), recording every engine call. A golden whose engines are not all among `exported` (an
    `--onnx` build of one engine) is skipped with a line."""
    import numpy as np

    from core.contract import get_contract
    from runtime.host.backends import OnnxBackend
    from runtime.board.golden import CallLog, EnginePool, run_loop

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
        entries = [(name, get_contract(by_name[name].onnx)) for name in spec["engines"]]

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

    def __init__(self, outputs: list[dict], input_names: list[str], output_names: list[str]):
        self._outputs, self.input_names, self.output_names = list(outputs), input_names, output_names

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
    import numpy as np

    from core.manifest import json_safe
    from gates.snr import max_abs, snr_db
    from runtime.board.golden import GOLDEN_FILE, SCHEMA_VERSION, ArrayWriter, EnginePool, as_stored, digest, run_loop
    from runtime.board.golden import write_index

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
        arrays = [writer.add("input", spec["name"], feeds[spec["name"]]) for spec in manifest["inputs"]]
        arrays += [writer.add("fp32", tensor, value) for tensor, value in result.reference_outputs.items()]
        arrays += [writer.add("simulator", tensor, value) for tensor, value in result.simulator_outputs.items()]
        contract = manifest["contract"]
        index["engines"].append({
            "engine": Path(result.rknn).name, "manifest": Path(result.manifest).name, "arrays": arrays,
            "reference": f"onnxruntime fp32 on {contract.get('reference_onnx') or manifest['onnx']['path']}",
            "simulator": manifest["simulator"], "min_snr_db": min_snr_db})
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
                                       [t["name"] for t in manifests[name]["inputs"]],
                                       [t["name"] for t in manifests[name]["outputs"]])
                   for name in spec["engines"]}
        with EnginePool([(name, manifests[name]["contract"]) for name in spec["engines"]], replays.__getitem__) as pool:
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
    import numpy as np

    from runtime.board.golden import GOLDEN_FILE, SCHEMA_VERSION, ArrayWriter, read_index, write_index

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


# --- the package (packaging time) ----------------------------------------------------------------------------

def module_file(module: str) -> Path | None:
    base = REPO_ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_level_imports(path: Path) -> list[str]:
    """Modules imported at module level (not inside functions or classes: those are lazy, board-side unused)."""
    found, pending = [], list(ast.parse(path.read_text()).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names if module_file(f"{node.module}.{alias.name}")]
        else:
            pending += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
    return found


def kit_modules(loops: list[str]) -> list[str]:
    """Every rkaudio module the kit imports at module level, from `runtime.board.selftest` and the end-to-end loops'
    modules, with their packages; a shipped module importing a non-shippable one is a PackageError."""
    pending = [KIT_ENTRY_MODULE, "runtime.board.golden"] + [loop.partition(":")[0] for loop in loops]
    seen: set[str] = set()
    while pending:
        module = pending.pop()
        top = module.split(".")[0]
        if module in seen or module_file(top) is None:  # third-party or stdlib
            continue
        if top not in SHIPPABLE_PACKAGES:
            raise PackageError(f"the board kit would need {module}; only {', '.join(SHIPPABLE_PACKAGES)} ship "
                               "(move what the board needs down into runtime/)")
        seen.add(module)
        parts = module.split(".")
        pending += [".".join(parts[:i]) for i in range(1, len(parts))]
        pending += _module_level_imports(module_file(module))
    return sorted(seen)


def install(package_dir: Path) -> int:
    """Copy `selftest.py` and the modules it needs into the package (unchanged); their bytes."""
    index = json.loads((package_dir / KIT_DIR / "index.json").read_text())
    written = 0
    for module in kit_modules([entry["loop"] for entry in index["end_to_end"]]):
        source = module_file(module)
        if module == KIT_ENTRY_MODULE:
            target = package_dir / KIT_SCRIPT
        else:
            target = package_dir / source.relative_to(REPO_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_file(target, source)
        written += target.stat().st_size
    return written


def kit_size(package_dir: Path) -> int:
    """Bytes of the kit in a package: the goldens, selftest.py and the shipped module folders."""
    parts = [Path(package_dir) / name for name in (KIT_DIR, KIT_SCRIPT, *SHIPPABLE_PACKAGES)]
    return sum(tree_bytes(part) for part in parts if part.exists())


def kit_budget(package_bytes: int) -> int:
    """At most max(1 MB, 5% of the package), never more than 20 MB."""
    return min(MAX_KIT_BYTES, max(MIN_KIT_BUDGET_BYTES, int(KIT_SHARE * package_bytes)))


def package_files(package_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(package_dir)) for p in package_dir.rglob("*")
                  if p.is_file() and p.name != SUMS_NAME)


def write_sums(package_dir: Path) -> Path:
    from core.manifest import sha256_file

    lines = [f"{sha256_file(package_dir / name)}  {name}" for name in package_files(package_dir)]
    return write_file(package_dir / SUMS_NAME, text="\n".join(lines) + "\n")


def verify(package_dir: Path) -> list[str]:
    """Every problem of a package: a file missing, changed or not listed in SHA256SUMS, an engine whose manifest
    is missing or disagrees with it (bytes, sha256), an exec_plan the consumer would refuse (runtime/exec_plan.py)
    or one naming an absent engine. Empty: intact."""
    from core.manifest import sha256_file
    from runtime.host.exec_plan import plan_problems
    from runtime.board.selftest import SetupProblem, read_sums

    package_dir = Path(package_dir)
    try:
        sums = read_sums(package_dir)
    except SetupProblem as problem:
        return [str(problem)]
    problems = []
    present = set(package_files(package_dir))
    for name in sorted(set(sums) - present):
        problems.append(f"missing: {name}")
    for name in sorted(present - set(sums)):
        problems.append(f"extra (not in {SUMS_NAME}): {name}")
    for name in sorted(set(sums) & present):
        if sha256_file(package_dir / name) != sums[name]:
            problems.append(f"changed: {name} (sha256 differs from {SUMS_NAME})")
    for engine in sorted(p for p in present if p.endswith(".rknn")):
        manifest_path = package_dir / manifest_name(Path(engine))
        if not manifest_path.is_file():
            problems.append(f"no manifest for {engine} ({manifest_path.name})")
            continue
        entry = json.loads(manifest_path.read_text())["rknn"]
        path = package_dir / engine
        if path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            problems.append(f"{engine}: {path.stat().st_size:,} bytes and its sha256 do not match its manifest "
                            f"({entry['bytes']:,} bytes)")
    plan_path = package_dir / "exec_plan.json"
    if plan_path.is_file():
        plan = json.loads(plan_path.read_text())
        refused = plan_problems(plan)
        problems += [f"exec_plan.json: {problem}" for problem in refused]
        if not refused:
            for option in plan.values():
                for component in option.values():
                    for files in component.get("artifacts", {}).values():
                        problems += [f"exec_plan.json names {a}, absent" for a in files.split(",") if a not in present]
    else:
        problems.append("missing: exec_plan.json")
    return problems


def rebuild_problems(package_dir: Path, onnx_dir: Path, say: Callable[[str], None] = print) -> list[str]:
    """Compile every engine of a package again from `onnx_dir` (its manifest's target and toolkit) and name each
    whose digest differs from the manifest's `normalized_sha256`."""
    import tempfile

    from converters.build.engine import BuildOptions, compile_only
    from core.manifest import sha256_file

    problems = []
    for manifest_path in sorted(Path(package_dir).glob("*.manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        onnx_path = Path(onnx_dir) / Path(manifest["onnx"]["path"]).name
        if not onnx_path.is_file():
            problems.append(f"{manifest['rknn']['path']}: no ONNX {onnx_path.name} in {onnx_dir} to rebuild it from")
            continue
        say(f"rebuilding {manifest['rknn']['path']} from {onnx_path} ...")
        with tempfile.TemporaryDirectory(prefix="rkaudio-rebuild-") as scratch:
            again = compile_only(onnx_path, BuildOptions(manifest["target"], manifest["toolkit_version"]),
                                 Path(scratch) / "again.rknn")
            digest = sha256_file(again)
        if digest != manifest["rknn"]["normalized_sha256"]:
            problems.append(f"{manifest['rknn']['path']}: a rebuild from {onnx_path.name} gives sha256 {digest[:12]}, "
                            f"the manifest says {manifest['rknn']['normalized_sha256'][:12]}")
    return problems


def add_to_package(package_dir: Path, work_dir: Path) -> dict:
    """Put the kit into an assembled package: the goldens, selftest.py and its modules, then SHA256SUMS over
    every file. PackageError when the kit exceeds its budget. Returns {kit_bytes, package_bytes, budget_bytes}."""
    source = Path(work_dir) / KIT_DIR
    if not (source / "index.json").is_file():
        raise PackageError(f"no self-test goldens in {source}: the engines were not built through converters.family.pipeline")
    (package_dir / KIT_DIR).mkdir()
    for path in sorted(source.iterdir()):
        write_file(package_dir / KIT_DIR / path.name, path)
    install(package_dir)
    kit_bytes, package_bytes = kit_size(package_dir), tree_bytes(package_dir)
    budget = kit_budget(package_bytes)
    if kit_bytes > budget:
        raise PackageError(f"the self-test kit is {kit_bytes:,} bytes, over its budget of {budget:,} "
                           f"(max(1 MB, 5% of the {package_bytes:,}-byte package), at most 20 MB): shorten the "
                           "family's end-to-end golden or its self-check inputs")
    write_sums(package_dir)
    return {"kit_bytes": kit_bytes, "package_bytes": tree_bytes(package_dir), "budget_bytes": budget}


# --- host replay -----------------------------------------------------------------------------------------------

class HostOpener:
    """Opens a package's engines on the host for `convert selftest`: `simulator` compiles each from its ONNX
    (the simulator refuses engines loaded from disk) and must reproduce the stored simulator outputs; `onnx`
    runs onnxruntime fp32 on the ONNX (or its fp32 twin)."""

    def __init__(self, package_dir: Path, backend: str, onnx_dir: Path | None = None):
        if backend not in ("simulator", "onnx"):
            raise SetupError(f"--backend {backend!r}: expected simulator or onnx")
        self.package_dir, self.name, self.onnx_dir = Path(package_dir), backend, onnx_dir
        self.replays_simulator = backend == "simulator"
        self.max_open = SIMULATORS_OPEN if backend == "simulator" else None
        self.info = {"host": True, "backend": backend}
        self._open: dict = {}

    def runtime_version(self):
        return None

    def core_count(self):
        return None

    def onnx_path(self, engine: str) -> Path:
        from runtime.board.selftest import SetupProblem

        manifest = json.loads((self.package_dir / manifest_name(Path(engine))).read_text())
        recorded = Path(manifest["onnx"]["path"])
        path = (Path(self.onnx_dir) / recorded.name) if self.onnx_dir else (self.package_dir / recorded)
        if not path.is_file():
            raise SetupProblem(f"no ONNX for {engine} at {path}: `convert engines` keeps it in the work directory "
                               "the manifest names; pass --onnx-dir where it is now")
        if self.name == "onnx" and manifest["contract"].get("reference_onnx"):
            path = path.parent / manifest["contract"]["reference_onnx"]
        return path

    def open(self, engine: str, core_mask: str):
        """The engine's backend, kept open across the kit's phases: a simulator compile takes seconds to minutes,
        so the end-to-end goldens reuse what the per-engine runs compiled (at most `max_open` at once)."""
        from runtime.host.backends import OnnxBackend, SimulatorBackend

        if engine not in self._open:
            while self.max_open is not None and len(self._open) >= self.max_open:
                self._open.pop(next(iter(self._open))).close()
            manifest = json.loads((self.package_dir / manifest_name(Path(engine))).read_text())
            if self.name == "onnx":
                self._open[engine] = OnnxBackend(self.onnx_path(engine))
            else:
                self._open[engine] = SimulatorBackend(self.onnx_path(engine), manifest["target"],
                                                      manifest["toolkit_version"])
        return _Kept(self._open[engine])

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()


class _Kept:
    """A backend the kit may `close()` after each phase while the opener keeps it for the next."""

    def __init__(self, backend):
        self._backend = backend
        self.input_names, self.output_names = backend.input_names, backend.output_names

    def run(self, feeds: dict) -> dict:
        return self._backend.run(feeds)

    def close(self) -> None:
        pass
