"""The board self-test kit, host side: put the kit into a package (the goldens `rkaudio.engine.goldens` wrote at
build time in `selftest/`, `selftest.py`, the board runtime folder `rkaudio/board/` copied unchanged, and
`SHA256SUMS`), verify a package against its sums and manifests, rebuild its engines, and replay the kit on the
host (`convert selftest`, `convert verify`).

What ships is a folder, not a scan: `rkaudio/__init__.py` (empty) and every module of `rkaudio/board/` (closed: it
imports only itself, numpy and the stdlib; tests/structure checks), with `rkaudio/board/selftest.py` at the
package root as `selftest.py` (run there as `python3 selftest.py`)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from rkaudio.engine.goldens import tree_bytes
from rkaudio.core.errors import PackageError, SetupError
from rkaudio.core.paths import PACKAGE_ROOT, REPO_ROOT, manifest_name
from rkaudio.board.contract import EngineContract
from rkaudio.board.files import KIT_DIR, SUMS_NAME

KIT_SCRIPT = "selftest.py"
KIT_ENTRY_MODULE = "rkaudio.board.selftest"
BOARD_PACKAGE = "rkaudio.board"  # the folder that ships, with its parent package's __init__.py
SHIPPED_FOLDERS = ("rkaudio",)  # the top-level folders a package's kit occupies (beside selftest/ and selftest.py)
MAX_KIT_BYTES, MIN_KIT_BUDGET_BYTES, KIT_SHARE = 20_000_000, 1_000_000, 0.05
SIMULATORS_OPEN = 4  # converter children alive at once in a host replay (each holds a compiled graph)


def write_file(target: Path, source: Path | None = None, text: str | None = None) -> Path:
    """Copy `source` (with its times) or write `text` to `target`; a failed write (disk full, a file-size limit,
    permissions) is a PackageError naming the file, so the staged package is dropped with one clear line."""
    try:
        if source is not None:
            shutil.copy2(source, target)
        else:
            Path(target).write_text(text)
    except OSError as error:
        raise PackageError(f"could not write {target}: {error.strerror or error}") from None
    return Path(target)


# --- the package (packaging time) ----------------------------------------------------------------------------

def kit_files() -> dict[Path, str]:
    """Source file in the repository -> its path in a package: `rkaudio/__init__.py`, every module of
    `rkaudio/board/` (its own layout), and `rkaudio/board/selftest.py` as `selftest.py` at the root."""
    board = REPO_ROOT.joinpath(*BOARD_PACKAGE.split("."))
    entry = REPO_ROOT.joinpath(*KIT_ENTRY_MODULE.split(".")).with_suffix(".py")
    sources = [PACKAGE_ROOT / "__init__.py"]
    sources += sorted(p for p in board.rglob("*.py") if "__pycache__" not in p.parts)
    return {source: KIT_SCRIPT if source == entry else str(source.relative_to(REPO_ROOT)) for source in sources}


def kit_modules() -> list[str]:
    """The dotted names of every module the kit ships (the listing of `rkaudio/board/`, with `rkaudio`)."""
    names = []
    for source in kit_files():
        parts = list(source.relative_to(REPO_ROOT).with_suffix("").parts)
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


def install(package_dir: Path) -> int:
    """Copy `selftest.py` and the board runtime folder into the package (unchanged); their bytes. An end-to-end
    golden whose loop is not a module of that folder is a PackageError (the board could not run it)."""
    package_dir = Path(package_dir)
    index = json.loads((package_dir / KIT_DIR / "index.json").read_text())
    shipped = set(kit_modules())
    for entry in index["end_to_end"]:
        module = entry["loop"].partition(":")[0]
        if module not in shipped or module == KIT_ENTRY_MODULE:
            raise PackageError(f"the end-to-end golden {entry['name']} runs {entry['loop']}, which the board kit "
                               f"does not ship: a loop is a module of {BOARD_PACKAGE.replace('.', '/')}/")
    written = 0
    for source, name in kit_files().items():
        target = package_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        write_file(target, source)
        written += target.stat().st_size
    return written


def kit_size(package_dir: Path) -> int:
    """Bytes of the kit in a package: the goldens, selftest.py and the shipped folders."""
    parts = [Path(package_dir) / name for name in (KIT_DIR, KIT_SCRIPT, *SHIPPED_FOLDERS)]
    return sum(tree_bytes(part) for part in parts if part.exists())


def kit_budget(package_bytes: int) -> int:
    """At most max(1 MB, 5% of the package), never more than 20 MB."""
    return min(MAX_KIT_BYTES, max(MIN_KIT_BUDGET_BYTES, int(KIT_SHARE * package_bytes)))


def package_files(package_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(package_dir)) for p in package_dir.rglob("*")
                  if p.is_file() and p.name != SUMS_NAME)


def write_sums(package_dir: Path) -> Path:
    from rkaudio.board.files import sha256_file

    lines = [f"{sha256_file(package_dir / name)}  {name}" for name in package_files(package_dir)]
    return write_file(package_dir / SUMS_NAME, text="\n".join(lines) + "\n")


def verify(package_dir: Path) -> list[str]:
    """Every problem of a package: a file missing, changed or not listed in SHA256SUMS, an engine whose manifest
    is missing or disagrees with it (bytes, sha256), an exec_plan the consumer would refuse (rkaudio/host/exec_plan.py:
    its rules, and a file in a role its manifest lists no shape set for) or one naming an absent engine. Empty:
    intact."""
    from rkaudio.board.files import sha256_file
    from rkaudio.host.exec_plan import plan_problems, shared_file_problems
    from rkaudio.board.selftest import SetupProblem, read_sums

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
        manifest_paths = {engine: package_dir / manifest_name(Path(engine)) for engine in present
                          if engine.endswith(".rknn")}
        manifests = {engine: json.loads(path.read_text()) for engine, path in manifest_paths.items() if path.is_file()}
        refused = plan_problems(plan) + shared_file_problems(plan, manifests)
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
    whose digest differs from the packaged engine's, the producer commit masked in both (`normalized_sha256`)."""
    import tempfile

    from rkaudio.engine.build import BuildOptions, compile_only
    from rkaudio.core.manifest import normalized_sha256

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
            digest = normalized_sha256(again, manifest.get("producer_git"))
        # The packaged engine's own masked digest: packages from before the commit was masked recorded the plain
        # sha256 as normalized_sha256, and `verify` has already checked the file against the manifest's sha256.
        packaged = normalized_sha256(Path(package_dir) / manifest["rknn"]["path"], manifest.get("producer_git"))
        if digest != packaged:
            problems.append(f"{manifest['rknn']['path']}: a rebuild from {onnx_path.name} gives sha256 {digest[:12]}, "
                            f"the packaged engine {packaged[:12]} (producer commit masked)")
    return problems


def add_to_package(package_dir: Path, work_dir: Path) -> dict:
    """Put the kit into an assembled package: the goldens, selftest.py and the board runtime, then SHA256SUMS over
    every file. PackageError when the kit exceeds its budget. Returns {kit_bytes, package_bytes, budget_bytes}."""
    source = Path(work_dir) / KIT_DIR
    if not (source / "index.json").is_file():
        raise PackageError(f"no self-test goldens in {source}: the engines were not built through rkaudio.pipeline.pipeline")
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
        from rkaudio.board.selftest import SetupProblem

        manifest = json.loads((self.package_dir / manifest_name(Path(engine))).read_text())
        recorded = Path(manifest["onnx"]["path"])
        path = (Path(self.onnx_dir) / recorded.name) if self.onnx_dir else (self.package_dir / recorded)
        if not path.is_file():
            raise SetupProblem(f"no ONNX for {engine} at {path}: `convert engines` keeps it in the work directory "
                               "the manifest names; pass --onnx-dir where it is now")
        reference = EngineContract.from_json(manifest["contract"]).reference_onnx
        if self.name == "onnx" and reference:
            path = path.parent / reference
        return path

    def open(self, engine: str, core_mask: str):
        """The engine's backend, kept open across the kit's phases: a simulator compile takes seconds to minutes,
        so the end-to-end goldens reuse what the per-engine runs compiled (at most `max_open` at once)."""
        from rkaudio.host.backends import OnnxBackend, SimulatorBackend

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

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


class _Kept:
    """A backend the kit may `close()` after each phase while the opener keeps it for the next."""

    def __init__(self, backend):
        self._backend = backend
        self.input_names, self.output_names = backend.input_names, backend.output_names
        self.input_dtypes = backend.input_dtypes

    def run(self, feeds: dict) -> dict:
        return self._backend.run(feeds)

    def close(self) -> None:
        pass
