"""Find string-key reads of an engine contract outside its (de)serialiser (`ast` only).

A contract is read through `rkaudio.board.contract.EngineContract` and the families' `ContractFields`, never as
`contract["window"]`. This finds the reads that would bypass it: a subscript, `.get` / `.pop` / `.setdefault`, or an
`in` test with a literal string key, on an expression that holds a contract:
- a name or attribute whose name says contract (`contract`, `main_contract`, `self.contract`, `engine.contract`),
- a call of a function whose name says contract (`get_contract(model)`),
- a `["contract"]` entry (a manifest's, a plan graph's),
- a name bound from any of these in the same function (`c = self.contract`, `for c in contracts`)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# The (de)serialiser: the only modules that read the JSON's keys.
SERIALISERS = ("rkaudio/board/contract.py", "rkaudio/core/contract.py")
READ_METHODS = ("get", "pop", "setdefault")


@dataclass(frozen=True)
class Read:
    path: str
    line: int
    key: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: contract read by key {self.key!r}"


def _says_contract(name: str) -> bool:
    return "contract" in name.lower()


def _holds_contract(node: ast.AST, bound: set) -> bool:
    if isinstance(node, ast.Name):
        return _says_contract(node.id) or node.id in bound
    if isinstance(node, ast.Attribute):  # `engine.contract`, and a model's raw family fields (`contract.fields`)
        return _says_contract(node.attr) or (node.attr == "fields" and _holds_contract(node.value, bound))
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return _says_contract(name)
    if isinstance(node, ast.Subscript):
        key = node.slice.value if isinstance(node.slice, ast.Index) else node.slice  # ast.Index before 3.9
        return isinstance(key, ast.Constant) and key.value == "contract"
    return False


def _literal(node: ast.AST, constants: dict):
    """The string key of a literal, or of a module-level string constant (`SET_KEY = "shape_set"`)."""
    if isinstance(node, ast.Index):
        node = node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _string_constants(tree: ast.Module) -> dict:
    return {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def _bound_names(scope: ast.AST) -> set:
    """Names a scope binds from a contract expression (assignment, loop, comprehension), to a fixed point."""
    bound: set = set()
    while True:
        before = len(bound)
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and _holds_contract(node.value, bound):
                bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, (ast.For, ast.comprehension)) and _holds_contract(node.iter, bound):
                if isinstance(node.target, ast.Name):
                    bound.add(node.target.id)
        if len(bound) == before:
            return bound


def reads_in(source: str, path: str) -> list[Read]:
    """Every string-key read of a contract in one module's source."""
    tree = ast.parse(source)
    constants = _string_constants(tree)
    found = set()
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))]
    for scope in scopes:
        bound = _bound_names(scope)
        for node in ast.walk(scope):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _holds_contract(node.value, bound):
                key = _literal(node.slice, constants)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in READ_METHODS and node.args and _holds_contract(node.func.value, bound)):
                key = _literal(node.args[0], constants)
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                if any(_holds_contract(c, bound) for c in node.comparators):
                    key = _literal(node.left, constants)
            if key is not None and key != "contract":
                found.add(Read(path, node.lineno, key))
    return sorted(found, key=lambda r: (r.line, r.key))


def contract_reads(repo: Path) -> list[Read]:
    """Every string-key read of a contract in the package, outside the serialisers."""
    out = []
    for module in sorted((repo / "rkaudio").rglob("*.py")):
        relative = module.relative_to(repo).as_posix()
        if relative not in SERIALISERS:
            out += reads_in(module.read_text(), relative)
    return out
