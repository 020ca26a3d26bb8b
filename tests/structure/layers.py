"""The layer rule of HACKING.md as code: every import (module level, function-local, or an
`importlib.import_module` string) of rkaudio's own modules must point at the same room or one below it, and no
modules import each other in a circle (`circles`), whatever their rooms.

Each room is one folder of the package, rkaudio/<room>/. Order, bottom up: board (what the board kit ships: it
imports nothing of rkaudio outside itself), core, gates, toolkit, host, surgery, engine, pipeline, release,
families (each family sees only itself among families), cli."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "rkaudio"
ROOM_ORDER = ("board", "core", "gates", "toolkit", "host", "surgery", "engine", "pipeline", "release", "families",
              "cli")
LAYERS = {f"{PACKAGE}.{room}": rank for rank, room in enumerate(ROOM_ORDER)}
FAMILIES = "rkaudio.families"
IMPORT_FUNCTIONS = {"import_module", "__import__"}


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    importer: str
    imported: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported} ({self.reason})"


def layer(module: str) -> int | None:
    """Rank of an rkaudio module (longest matching prefix), None for modules outside rkaudio."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        rank = LAYERS.get(".".join(parts[:end]))
        if rank is not None:
            return rank
    return None


def family_of(module: str) -> str | None:
    prefix = FAMILIES + "."
    return module[len(prefix):].split(".")[0] if module.startswith(prefix) else None


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.AST, importer: str, is_package: bool):
    """(line, module) of every import in `tree`, wherever it stands; import_module strings are read up to
    their first placeholder (f"rkaudio.families.{name}" counts as rkaudio.families.)."""
    package = importer if is_package else importer.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if alias.name != "*" else base
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in IMPORT_FUNCTIONS:
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value
            elif isinstance(first, ast.JoinedStr) and first.values and isinstance(first.values[0], ast.Constant):
                yield node.lineno, str(first.values[0].value).rstrip(".")


def violations(root: Path) -> list[Violation]:
    """Every import against the order in the rooms under `root`. A module with no rank (a bare parent package
    `rkaudio` itself, or a file outside every room) may import nothing of rkaudio."""
    found = []
    for importer, path in module_files(root).items():
        own_rank, own_family = layer(importer), family_of(importer)
        tree = ast.parse(path.read_text(), str(path))
        for line, imported in imported_names(tree, importer, path.name == "__init__.py"):
            rank = layer(imported)
            if rank is None:
                continue
            where = str(path.relative_to(root))
            if own_rank is None:
                found.append(Violation(where, line, importer, imported, "from a module in no room"))
            elif rank > own_rank:
                found.append(Violation(where, line, importer, imported, "upward"))
            elif own_family and family_of(imported) not in (None, own_family):
                found.append(Violation(where, line, importer, imported, "another family"))
    return found


def unranked(root: Path) -> list[str]:
    """The rkaudio modules under `root` that belong to no room (LAYERS), the package's own __init__ aside."""
    return sorted(m for m in module_files(root) if layer(m) is None and m != PACKAGE)


def folders_not_rooms(root: Path) -> list[str]:
    """The folders of rkaudio/ that are not a room, and the rooms with no folder: one folder is one room."""
    folders = {p.name for p in (Path(root) / PACKAGE).iterdir() if p.is_dir() and p.name != "__pycache__"}
    return sorted(folders.symmetric_difference(ROOM_ORDER))


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the rkaudio package under `root`, by dotted name."""
    return {module_name(Path(root), path): path for path in sorted((Path(root) / PACKAGE).rglob("*.py"))
            if "__pycache__" not in path.parts}


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the rkaudio modules it imports (anywhere in its text). `from a.b import c` points at the module
    a.b.c when there is one, else at a.b; an import of a package's own submodule from its __init__ counts too."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {}
    for importer, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for _, imported in imported_names(tree, importer, path.name == "__init__.py"):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != importer:
                targets.add(imported)
        graph[importer] = targets
    return graph


def circles(root: Path) -> list[list[str]]:
    """Each set of modules that import each other in a circle (a strongly connected component of more than one
    module, Tarjan's algorithm), sorted; empty when the imports form a tree-like order."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)
