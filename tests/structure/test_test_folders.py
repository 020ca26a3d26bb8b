"""The tests mirror the rooms: each folder of tests/ is a room of rkaudio/ (tests/<room>/, the code it mainly tests),
tests/families/<name>/ holds the tests of one family of rkaudio/families/ (even where they exercise a room: they need
the family), tests/structure/ tests the project's shape and tests/bench/ the bench. No test file reaches another test
folder through sys.path: tests import each other's helpers through the `tests.` package (pytest runs in importlib
mode from the repository root), and a helper two folders share lives at tests/ top level."""
from __future__ import annotations

import ast
import pkgutil
import shutil
from pathlib import Path

from rkaudio.core.paths import REPO_ROOT
from tests.structure.layers import PACKAGE, ROOM_ORDER

# The folders of tests/ that are no room of rkaudio/: the project's shape, the bench's harness.
NOT_ROOMS = ("structure", "bench")
SYS_PATH_CHANGES = {"insert", "append", "extend", "syspath_prepend"}  # list methods of sys.path; pytest's monkeypatch


def _folders(directory: Path) -> list[Path]:
    """The folders in `directory` that hold a file: a folder a checkout left behind with only bytecode in it (its
    sources moved away) is none."""
    if not directory.is_dir():
        return []
    return [p for p in sorted(directory.iterdir())
            if p.is_dir() and any(f.is_file() and "__pycache__" not in f.parts for f in p.rglob("*"))]


def folders_not_rooms(root: Path) -> list[str]:
    """The folders of tests/ under `root` that are neither a room of rkaudio/ (`families` is one) nor NOT_ROOMS."""
    return [p.name for p in _folders(root / "tests") if p.name not in (*ROOM_ORDER, *NOT_ROOMS)]


def families(root: Path) -> set[str]:
    """The families of rkaudio/families/ under `root`: each package or module there (what the CLI discovers)."""
    return {info.name for info in pkgutil.iter_modules([str(root / PACKAGE / "families")])}


def family_folders_not_families(root: Path) -> list[str]:
    return [p.name for p in _folders(root / "tests" / "families") if p.name not in families(root)]


def _names_a_test_folder(text: str) -> bool:
    """A path built from the test file's own location, or naming the tests folder."""
    return "__file__" in text or "tests" in text


def sys_path_test_folders(root: Path) -> list[str]:
    """`path:line` of every sys.path change in a file under tests/ (`sys.path.insert/append/extend`, an assignment to
    `sys.path` or a slice of it, `monkeypatch.syspath_prepend`) whose path names a test folder: built from `__file__`,
    directly or through a module-level name, or naming `tests`. A temporary folder on sys.path (a fake package a test
    writes) is no test folder."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        bound = {target.id: ast.unparse(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in SYS_PATH_CHANGES
                    and (node.func.attr == "syspath_prepend" or ast.unparse(node.func.value) == "sys.path")):
                values = node.args
            elif (isinstance(node, (ast.Assign, ast.AugAssign))
                  and any(ast.unparse(target).startswith("sys.path")
                          for target in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
                values = [node.value]
            else:
                continue
            texts = [ast.unparse(value) for value in values]
            texts += [bound[name.id] for value in values for name in ast.walk(value)
                      if isinstance(name, ast.Name) and name.id in bound]
            if any(_names_a_test_folder(text) for text in texts):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_test_folder_is_a_room_or_the_structure():
    assert folders_not_rooms(REPO_ROOT) == [], f"tests/ folders: rooms {ROOM_ORDER} and {NOT_ROOMS} only"


def test_every_family_folder_is_a_family():
    assert family_folders_not_families(REPO_ROOT) == [], f"the families are {sorted(families(REPO_ROOT))}"


def test_no_test_puts_a_test_folder_on_sys_path():
    assert sys_path_test_folders(REPO_ROOT) == [], "import through the `tests.` package (from tests.x import ...)"


PLANTED_SYS_PATH = {
    "engine/test_planted_insert.py": 'import sys\nfrom pathlib import Path\n\n'
                                     'sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gates"))\n',
    "gates/test_planted_append.py": 'import sys\nfrom rkaudio.core.paths import REPO_ROOT\n\n'
                                    'sys.path.append(str(REPO_ROOT / "tests" / "engine"))\n',
    "toolkit/test_planted_bound.py": 'import sys\nfrom pathlib import Path\n\nHERE = Path(__file__).parent\n'
                                     'sys.path[:0] = [str(HERE.parent / "engine")]\n',
    "board/test_planted_fixture.py": 'from pathlib import Path\n\n\ndef test_x(monkeypatch, tmp_path):\n'
                                     '    monkeypatch.syspath_prepend(str(tmp_path))  # a fake package: allowed\n'
                                     '    monkeypatch.syspath_prepend(str(Path(__file__).parent))\n',
}


def test_a_folder_that_is_no_room_a_stray_family_and_a_test_folder_on_sys_path_are_named(tmp_path):
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO_ROOT / "tests", tmp_path / "tests", ignore=ignore)
    shutil.copytree(REPO_ROOT / PACKAGE / "families", tmp_path / PACKAGE / "families", ignore=ignore)
    for folder in ("tests/engine_build", "tests/families/vits", "tests/families/kokoro/small"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "test_planted.py").write_text("")
    left_behind = tmp_path / "tests" / "hearing" / "__pycache__"  # a moved folder's bytecode: no folder
    left_behind.mkdir(parents=True)
    (left_behind / "test_speech.cpython-312.pyc").write_bytes(b"")
    shutil.rmtree(tmp_path / PACKAGE / "families" / "inflect")
    for name, text in PLANTED_SYS_PATH.items():
        (tmp_path / "tests" / name).write_text(text)
    assert folders_not_rooms(tmp_path) == ["engine_build"]
    assert family_folders_not_families(tmp_path) == ["inflect", "vits"]
    assert sys_path_test_folders(tmp_path) == ["tests/board/test_planted_fixture.py:6",
                                               "tests/engine/test_planted_insert.py:4",
                                               "tests/gates/test_planted_append.py:4",
                                               "tests/toolkit/test_planted_bound.py:5"]
