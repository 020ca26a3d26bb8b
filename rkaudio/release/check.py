"""The engine a `convert check <family>` renders through, chosen the same way for every family: `--backend onnx`
(the engine graph in onnxruntime with every tensor rounded to fp16: the host's estimate of the NPU's fp16, never the
fp32 graph against itself) or `--backend simulator` (compiled for `--target` in rknn-toolkit2's simulator, fp16 noise
and all), from a fresh export at the shape the release recipe ships for that target, or from a package's ONNX
(`--package DIR`). The fp32 render it is judged against is the same walk through the ONNX's exact fp32 twin (or the
ONNX itself).

A family's check declares a parameter `engines: EngineChoice`; rkaudio/cli/families.py then gives the command
the shared options below and passes the choice in."""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional

import typer

from rkaudio.board.contract import EngineContract
from rkaudio.core.errors import SetupError

BACKENDS = ("onnx", "simulator")
# What `--backend onnx` is, in every check's output: the host's estimate of the NPU's fp16, not the NPU.
FP16_ESTIMATE = "onnxruntime, every tensor rounded to fp16: the fp16 estimate"

Backend = Annotated[str, typer.Option(
    "--backend", help="Render through the engine graph in onnxruntime with every tensor rounded to fp16 (`onnx`: "
    "the fp16 estimate, no converter venv needed), or through the engine compiled for --target in the rknn-toolkit2 "
    "simulator (`simulator`: what the NPU's fp16 produces, REGTASK damage aside).")]
Package = Annotated[Optional[Path], typer.Option(
    "--package", help="A package built by `convert engines` (dist/<target>/<package>_<target>/): render through "
    "its engines' ONNX (kept under work/dist/, the manifests name it) instead of a fresh export; its target and "
    "toolkit are the package's.")]


@dataclass(frozen=True)
class EngineChoice:
    """What a check renders through: the backend, the target and toolkit it compiles for, and the package whose
    ONNX it reuses (None: the family exports one). `family_for` reads a family's declaration (the recipes of
    rkaudio/release need it)."""

    family: str
    backend: str
    target: str
    toolkit: str
    package: Path | None
    family_for: Callable[[str], object]

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise SetupError(f"--backend {self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if self.package is not None and not Path(self.package).is_dir():
            raise SetupError(f"--package {self.package}: no such package directory (dist/<target>/<package>_<target>/)")

    def recipe_option(self, component: str | None, key: str, default=None):
        """The value of option `key` that the release recipe of this family ships for this target (the first
        recipe, by package name, listing the target), or `default` when no recipe names it."""
        from rkaudio.release.recipes import RECIPES_DIR, load_recipes, recipes_for

        for recipe in load_recipes(RECIPES_DIR, self.family_for):
            if recipe["family"] != self.family or self.target not in recipe["targets"]:
                continue
            for part in recipes_for(recipe, self.target):
                if component is None or part.get("component", component) == component:
                    if key in part["options"]:
                        return part["options"][key]
        return default

    def package_onnx(self, component: str | None = None) -> list[Path]:
        """The ONNX of each engine of --package (of `component`, when given), in the manifests' ladder order."""
        package = Path(self.package)
        family = self.family_for(self.family).contract_name
        found = []
        for manifest_path in sorted(package.glob("*.manifest.json")):
            manifest = json.loads(manifest_path.read_text())
            contract = EngineContract.from_json(manifest.get("contract"))
            if contract.family != family:
                raise SetupError(f"{package} holds {contract.family!r} engines, not {family}")
            if component is not None and contract.component not in (None, component):
                continue
            path = package / manifest["onnx"]["path"]
            if not path.is_file():
                raise SetupError(f"no ONNX for {manifest_path.name} at {path}: `convert engines` keeps it in the "
                                 "work directory the manifest names (work/dist/...); rebuild the package")
            found.append((contract.ladder_order, path))
        if not found:
            raise SetupError(f"{package} has no {self.family} {component or ''} engine manifest".replace("  ", " "))
        return [path for _, path in sorted(found, key=lambda item: item[0])]

    def chosen_onnx(self, given: Path | None, component: str, spelt: str) -> Path | None:
        """The engine ONNX the check renders: `given` (the check's own engine argument, spelt `spelt` on the
        command line) or --package's one engine of `component`; None when neither (the family exports one or
        says what to pass)."""
        if self.package is None:
            return given
        if given is not None:
            raise SetupError(f"{spelt} {given} and --package {self.package} both name an engine: give one")
        (onnx_path,) = self.package_onnx(component)
        return onnx_path

    def compiled_for(self) -> tuple[str, str]:
        """(target, toolkit) the simulator compiles for: --package's (from its first manifest), else the options'."""
        if self.package is None:
            return self.target, self.toolkit
        manifest = json.loads(next(Path(self.package).glob("*.manifest.json")).read_text())
        return manifest["target"], manifest["toolkit_version"]

    @property
    def label(self) -> str:
        """What renders the engine, for titles: `onnxruntime, fp16 estimate` (every tensor rounded to fp16), or
        `simulator, <target>, toolkit <version>` (a package's own target and toolkit with --package)."""
        if self.backend == "onnx":
            return FP16_ESTIMATE
        target, toolkit = self.compiled_for()
        return f"simulator, {target}, toolkit {toolkit}"

    @contextmanager
    def open(self, onnx_path: Path) -> Iterator:
        """The engine backend of `onnx_path`: onnxruntime on the graph with every fp32 tensor and weight rounded to
        fp16 (rkaudio.gates.fp16_floor.fp16_rounded: what the NPU stores, so the render differs from the fp32 one by the
        fp16 estimate; a graph that relies on fp16 arithmetic, like the round Snake sine, computes what it should
        only so), or the simulator compiling it."""
        from rkaudio.host.backends import OnnxBackend, SimulatorBackend

        if self.backend == "onnx":
            import onnx

            from rkaudio.gates.fp16_floor import fp16_rounded

            yield OnnxBackend(fp16_rounded(onnx.load(str(onnx_path))))
            return
        target, toolkit = self.compiled_for()
        print(f"compiling {Path(onnx_path).name} for {target} in the rknn-toolkit2 {toolkit} simulator ...")
        with SimulatorBackend(onnx_path, target, toolkit) as backend:
            yield backend

    @staticmethod
    def fp32(onnx_path: Path):
        """onnxruntime on the exact fp32 twin of `onnx_path` when it has one (a graph relying on fp16 maths),
        else on the ONNX itself: the render the engine is judged against."""
        from rkaudio.core.paths import reference_path
        from rkaudio.host.backends import OnnxBackend

        twin = reference_path(Path(onnx_path))
        return OnnxBackend(twin if twin.is_file() else onnx_path)
