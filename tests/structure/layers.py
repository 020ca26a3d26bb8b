"""The layer rule of HACKING.md as code: every import (module level, function-local, or an
`importlib.import_module` string) of rkaudio's own modules must point at the same room or one below it.

Order, bottom up: core, gates, toolkit, runtime, surgery, converters (engine, pipeline, recipes, package,
options), converters.families (each family sees only itself among families), converters.commands / cli."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

LAYERS = {
    "core": 0,
    "gates": 1,
    "toolkit": 2,
    "runtime": 3,
    "surgery": 4,
    "converters": 5,
    "converters.families": 6,
    "converters.commands": 7,
    "converters.cli": 7,
}
ROOMS = ("core", "gates", "toolkit", "runtime", "surgery", "converters")
FAMILIES = "converters.families"
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
    their first placeholder (f"converters.families.{name}" counts as converters.families.)."""
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
    """Every import against the order in the rooms under `root`."""
    found = []
    for room in ROOMS:
        for path in sorted((Path(root) / room).rglob("*.py")):
            importer = module_name(Path(root), path)
            own_rank, own_family = layer(importer), family_of(importer)
            tree = ast.parse(path.read_text(), str(path))
            for line, imported in imported_names(tree, importer, path.name == "__init__.py"):
                rank = layer(imported)
                if rank is None:
                    continue
                where = str(path.relative_to(root))
                if rank > own_rank:
                    found.append(Violation(where, line, importer, imported, "upward"))
                elif own_family and family_of(imported) not in (None, own_family):
                    found.append(Violation(where, line, importer, imported, "another family"))
    return found
