"""The layer rule holds in the repository, the checker catches what it is for (lazy imports and
import_module strings included, in every room), no modules import each other in a circle, the board folder
(what the kit ships) is closed, the converter child imports nothing of rkaudio's world, and the board backend
imports with numpy alone."""
from __future__ import annotations

import ast
import functools
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rkaudio.core.paths import REPO_ROOT
from tests.structure.layers import (LAYERS, PACKAGE, ROOM_ORDER, circles, folders_not_rooms, imported_names, layer,
                                    module_name, unranked, violations)

# Every room below the CLI, bottom up: an import of rkaudio.cli from any of them is upward.
LEAF_ROOMS = tuple(room for room in sorted(LAYERS, key=LAYERS.get) if room != "rkaudio.cli")
BOARD = REPO_ROOT / "rkaudio" / "board"
# Standard-library modules newer than the board's Python 3.8 (sys.stdlib_module_names is the host's).
AFTER_PY38 = {"zoneinfo", "graphlib", "tomllib"}


def test_the_repository_imports_only_downward():
    found = violations(REPO_ROOT)
    assert not found, "imports against the layer order (HACKING.md):\n" + "\n".join(map(str, found))


def test_the_repository_has_no_circles():
    found = circles(REPO_ROOT)
    assert found == [], "modules importing each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_module_belongs_to_a_room():
    assert unranked(REPO_ROOT) == []


def test_one_folder_is_one_room():
    assert folders_not_rooms(REPO_ROOT) == []


def test_a_folder_that_is_no_room_is_named(tmp_path):
    _copy_rooms(tmp_path)
    (tmp_path / PACKAGE / "build").mkdir()
    (tmp_path / PACKAGE / "build" / "__init__.py").write_text("")
    shutil.rmtree(tmp_path / PACKAGE / "host")
    assert folders_not_rooms(tmp_path) == ["build", "host"]
    assert unranked(tmp_path) == ["rkaudio.build"]


def _copy_rooms(destination: Path) -> None:
    shutil.copytree(REPO_ROOT / PACKAGE, destination / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))


@functools.lru_cache(maxsize=1)
def _known() -> frozenset:
    """What the tree holds already (not a planted test's business): a copy's violations, paths relative."""
    return frozenset(violations(REPO_ROOT))


def _leaf(root: Path, room: str) -> Path:
    """The first module of `room` that is not a package's __init__."""
    return sorted(p for p in root.joinpath(*room.split(".")).rglob("*.py") if p.name != "__init__.py")[0]


UPWARD = {
    "lazy import": "\n\ndef _planted():\n    from rkaudio.cli.commands import register\n    return register\n",
    "import_module string": "\n\ndef _planted(name):\n    import importlib\n"
                            "    return importlib.import_module(f\"rkaudio.cli.{name}\")\n",
}


@pytest.mark.parametrize("form", sorted(UPWARD))
@pytest.mark.parametrize("room", LEAF_ROOMS)
def test_an_upward_import_planted_in_any_room_below_the_cli_is_caught(tmp_path, room, form):
    _copy_rooms(tmp_path)
    leaf = _leaf(tmp_path, room)
    leaf.write_text(leaf.read_text() + UPWARD[form])
    found = [v for v in violations(tmp_path) if v not in _known()]
    assert [(v.path, v.reason) for v in found] == [(str(leaf.relative_to(tmp_path)), "upward")], found


@pytest.mark.parametrize("lower, higher", list(zip(LEAF_ROOMS, LEAF_ROOMS[1:] + ("rkaudio.cli",))))
def test_an_import_one_room_up_is_caught(tmp_path, lower, higher):
    _copy_rooms(tmp_path)
    leaf, target = _leaf(tmp_path, lower), _leaf(tmp_path, higher)
    leaf.write_text(leaf.read_text() + f"\n\ndef _planted():\n    import {module_name(tmp_path, target)}\n")
    found = [v for v in violations(tmp_path) if v not in _known()]
    assert [(v.importer, v.imported, v.reason) for v in found] == [
        (module_name(tmp_path, leaf), module_name(tmp_path, target), "upward")]


def test_one_family_importing_another_is_caught(tmp_path):
    _copy_rooms(tmp_path)
    piper = tmp_path / "rkaudio" / "families" / "piper" / "__init__.py"
    piper.write_text(piper.read_text() + "\nfrom rkaudio.families.kokoro import sources\n")
    assert [v.reason for v in violations(tmp_path) if v not in _known()] == ["another family"]


def test_a_module_in_no_room_may_import_nothing_of_rkaudio(tmp_path):
    _copy_rooms(tmp_path)
    stray = tmp_path / "rkaudio" / "stray.py"
    stray.write_text("from rkaudio.core.errors import SetupError\n")
    assert unranked(tmp_path) == ["rkaudio.stray"]
    assert [(v.importer, v.reason) for v in violations(tmp_path) if v.importer == "rkaudio.stray"] == [
        ("rkaudio.stray", "from a module in no room")]


def _new_circles(root: Path) -> list[list[str]]:
    known = circles(REPO_ROOT)
    return [c for c in circles(root) if c not in known]


def test_a_planted_back_edge_is_named_as_a_circle(tmp_path):
    """rkaudio.engine.build imports rkaudio.engine.analysis; a lazy import back (same room, so no layer
    violation) closes a circle that only `circles` sees."""
    _copy_rooms(tmp_path)
    analysis = tmp_path / "rkaudio" / "engine" / "analysis.py"
    analysis.write_text(analysis.read_text() + "\n\ndef _planted():\n    from rkaudio.engine import build\n")
    assert not [v for v in violations(tmp_path) if v.importer == "rkaudio.engine.analysis"]
    assert _new_circles(tmp_path) == [["rkaudio.engine.analysis", "rkaudio.engine.build"]]


def test_two_new_modules_importing_each_other_are_named(tmp_path):
    _copy_rooms(tmp_path)
    release = tmp_path / "rkaudio" / "release"
    (release / "planted_a.py").write_text("from rkaudio.release import planted_b\n")
    (release / "planted_b.py").write_text("def f():\n    from rkaudio.release.planted_a import x\n")
    assert _new_circles(tmp_path) == [["rkaudio.release.planted_a", "rkaudio.release.planted_b"]]


def test_ranks_follow_the_written_order():
    order = ["rkaudio.board.golden", "rkaudio.core.errors", "rkaudio.gates.snr", "rkaudio.toolkit.session", "rkaudio.host.backends",
             "rkaudio.surgery.graph.fold", "rkaudio.engine.build", "rkaudio.pipeline.pipeline",
             "rkaudio.release.kit", "rkaudio.families.example", "rkaudio.cli.commands"]
    ranks = [layer(m) for m in order]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks), dict(zip(order, ranks))
    assert ROOM_ORDER == ("board", "core", "gates", "toolkit", "host", "surgery", "engine", "pipeline", "release",
                          "families", "cli")
    assert list(LAYERS) == [f"rkaudio.{room}" for room in ROOM_ORDER]
    assert layer("numpy") is None and layer("rkaudio") is None and layer("core") is None


def test_relative_imports_resolve_against_their_package():
    tree = ast.parse(textwrap.dedent("""
        from . import child
        from ...engine.build import build_engine
    """))
    names = [name for _, name in imported_names(tree, "rkaudio.families.example", is_package=True)]
    assert names == ["rkaudio.families.example.child", "rkaudio.engine.build.build_engine"]


def _board_files() -> list[Path]:
    return [REPO_ROOT / "rkaudio" / "__init__.py", *sorted(p for p in BOARD.rglob("*.py") if "__pycache__" not in p.parts)]


def test_the_board_folder_is_closed_and_python_3_8():
    """What the kit ships (rkaudio/__init__.py and rkaudio/board/) imports, anywhere in its text, only itself,
    numpy and the 3.8 standard library; rknnlite (the board's runtime) only in rknnlite.py, and pocketsphinx (an
    optional ear, imported lazily) only in speech.py."""
    wrong = []
    for path in _board_files():
        text = path.read_text()
        tree = ast.parse(text, filename=str(path), feature_version=(3, 8))
        importer = module_name(REPO_ROOT, path)
        for line, imported in imported_names(tree, importer, path.name == "__init__.py"):
            root = imported.split(".")[0]
            allowed = (imported == "rkaudio.board" or imported.startswith("rkaudio.board.") or root == "numpy"
                       or (root in sys.stdlib_module_names and root not in AFTER_PY38 and root != "rkaudio")
                       or (root == "rknnlite" and path == BOARD / "rknnlite.py")
                       or (root == "pocketsphinx" and path == BOARD / "speech.py"))
            if not allowed:
                wrong.append(f"{path.relative_to(REPO_ROOT)}:{line}: {imported}")
    assert not wrong, "the board folder imports from outside itself:\n" + "\n".join(wrong)


def test_the_converter_child_imports_only_the_stdlib_numpy_onnxruntime_and_rknn():
    """What the converter venv pins for the toolkit; onnxruntime runs the toolkit's simulator sessions."""
    tree = ast.parse((REPO_ROOT / "rkaudio" / "toolkit" / "child.py").read_text())
    roots = {name.split(".")[0] for _, name in imported_names(tree, "rkaudio.toolkit.child", is_package=False)}
    assert roots - set(sys.stdlib_module_names) <= {"numpy", "onnxruntime", "rknn"}, roots


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

    from rkaudio.board.rknnlite import RknnLiteBackend
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
