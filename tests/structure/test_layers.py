"""The layer rule holds in the repository, the checker catches what it is for (lazy imports and
import_module strings included), the converter child imports nothing of rkaudio's world, and the board
backend imports with numpy alone."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core.paths import REPO_ROOT
from tests.structure.layers import ROOMS, imported_names, layer, violations

LEAF_ROOMS = ("core", "gates", "toolkit", "runtime", "surgery")


def test_the_repository_imports_only_downward():
    found = violations(REPO_ROOT)
    assert not found, "imports against the layer order (HACKING.md):\n" + "\n".join(map(str, found))


def _copy_rooms(destination: Path) -> None:
    for room in ROOMS:
        shutil.copytree(REPO_ROOT / room, destination / room, ignore=shutil.ignore_patterns("__pycache__"))


UPWARD = {
    "lazy import": "\n\ndef _planted():\n    from converters.build.engine import build_engine\n    return build_engine\n",
    "import_module string": "\n\ndef _planted(name):\n    import importlib\n"
                            "    return importlib.import_module(f\"converters.families.{name}\")\n",
}


@pytest.mark.parametrize("form", sorted(UPWARD))
@pytest.mark.parametrize("room", LEAF_ROOMS)
def test_an_upward_import_planted_in_any_leaf_room_is_caught(tmp_path, room, form):
    _copy_rooms(tmp_path)
    leaf = sorted(p for p in (tmp_path / room).rglob("*.py") if p.name != "__init__.py")[0]
    leaf.write_text(leaf.read_text() + UPWARD[form])
    found = violations(tmp_path)
    assert [(v.path, v.reason) for v in found] == [(str(leaf.relative_to(tmp_path)), "upward")], found


def test_one_family_importing_another_is_caught(tmp_path):
    _copy_rooms(tmp_path)
    piper = tmp_path / "converters" / "families" / "piper" / "__init__.py"
    piper.write_text(piper.read_text() + "\nfrom converters.families.kokoro import sources\n")
    assert [v.reason for v in violations(tmp_path)] == ["another family"]


def test_ranks_follow_the_written_order():
    order = ["core.errors", "gates.snr", "toolkit.session", "runtime.host.backends", "surgery.graph.fold",
             "converters.family.pipeline", "converters.families.example", "converters.cli"]
    assert [layer(m) for m in order] == sorted(layer(m) for m in order)
    assert layer("numpy") is None and layer("converters.families") > layer("converters.build.engine")


def test_relative_imports_resolve_against_their_package():
    tree = ast.parse(textwrap.dedent("""
        from . import child
        from ...engine import build_engine
    """))
    names = [name for _, name in imported_names(tree, "converters.families.example", is_package=True)]
    assert names == ["converters.families.example.child", "converters.build.engine.build_engine"]


def test_the_converter_child_imports_only_the_stdlib_numpy_and_rknn():
    tree = ast.parse((REPO_ROOT / "toolkit" / "child.py").read_text())
    roots = {name.split(".")[0] for _, name in imported_names(tree, "toolkit.child", is_package=False)}
    assert roots - set(sys.stdlib_module_names) <= {"numpy", "rknn"}, roots


BOARD_PROBE = textwrap.dedent("""
    import json, sys, types
    from pathlib import Path
    import numpy as np

    class Refuse:  # what a board does not have
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"onnx", "onnxruntime", "torch", "typer", "scipy", "onnxslim"}:
                raise ImportError(f"{name} is not on the board")
    sys.meta_path.insert(0, Refuse())

    class FakeLite:  # rknn-toolkit-lite2's RKNNLite, as far as the backend uses it
        NPU_CORE_0_1_2, NPU_CORE_AUTO = 7, 0
        def load_rknn(self, path): return 0
        def init_runtime(self, core_mask): return 0
        def inference(self, inputs, data_format): return [inputs[0] * 2]
        def release(self): pass
    api = types.ModuleType("rknnlite.api"); api.RKNNLite = FakeLite
    sys.modules["rknnlite"] = types.ModuleType("rknnlite"); sys.modules["rknnlite.api"] = api

    from runtime.board.rknnlite import RknnLiteBackend
    folder = Path(sys.argv[1])
    (folder / "e.rknn").write_bytes(b"")
    (folder / "e.manifest.json").write_text(json.dumps({"toolkit_version": "2.3.2",
        "inputs": [{"name": "x", "shape": [1, 2], "dtype": "float32"}],
        "outputs": [{"name": "y", "shape": [1, 2], "dtype": "float32"}]}))
    with RknnLiteBackend(folder / "e.rknn") as engine:
        print(engine.run({"x": np.ones((1, 2), np.float32)})["y"].tolist(), engine.core_mask)
""")


def test_the_board_backend_imports_with_numpy_alone(tmp_path):
    result = subprocess.run([sys.executable, "-c", BOARD_PROBE, str(tmp_path)], cwd=REPO_ROOT,
                            capture_output=True, text=True, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[[2.0,", "2.0]]", "0_1_2"]
