"""Engines compiled for several input shape sets (a dynamic ladder: `config(dynamic_input=...)`, the weights stored
once). The contract of such an engine lists its sets under `shape_sets`, each with the input and output shapes and
the contract fields that differ from set to set (role, ladder key, bucket, window); a loop sees one engine per set
(`EngineContract.views`), and every backend takes a feed only at the shapes of one listed set (`matching_set`).
Shipped in the self-test kit: numpy and the stdlib only, Python 3.8 syntax."""
from __future__ import annotations

from typing import Dict, List

from rkaudio.board.contract import EngineContract

SET_KEY = "shape_set"  # the set an engine entry of the kit's index stands for
SUFFIX = "@"  # `<tensor>@<set>`: a tensor of one set, in self-check files and per-set figures


class ShapeRefused(ValueError):
    """A feed whose shapes match none of the engine's shape sets (the engine cannot run it)."""


def shape_sets(contract: EngineContract) -> List[dict]:
    """The engine's shape sets (empty for a fixed-shape engine)."""
    return list(contract.shape_sets or [])


def keyed(name: str, number: int) -> str:
    return f"{name}{SUFFIX}{number}"


def unkeyed(name: str) -> tuple:
    """(tensor, set number) of a keyed name; (name, None) for a plain one."""
    tensor, mark, number = name.rpartition(SUFFIX)
    return (tensor, int(number)) if mark and number.isdigit() else (name, None)


def of_set(arrays: Dict[str, object], number: int) -> Dict[str, object]:
    """The entries of set `number` of a keyed dict, under their plain names."""
    return {unkeyed(name)[0]: value for name, value in arrays.items() if unkeyed(name)[1] == number}


def check_set(contract: EngineContract, shapes: Dict[str, tuple], engine: str = "the engine") -> None:
    """ShapeRefused unless `shapes` are those of the set a view's `contract` stands for (a fixed-shape contract
    passes: its engine checks its own shapes)."""
    if contract.shape_set is not None and matching_set(shape_sets(contract), shapes, engine) != contract.shape_set:
        raise ShapeRefused(f"{engine}: fed the shapes of shape set {matching_set(shape_sets(contract), shapes)}, "
                           f"through the view of set {contract.shape_set}")


def matching_set(sets: List[dict], shapes: Dict[str, tuple], engine: str = "the engine") -> int:
    """The number of the set whose input shapes are `shapes` (input name -> shape); ShapeRefused naming the fed
    shapes and the listed ones when none is."""
    fed = {name: [int(d) for d in shape] for name, shape in shapes.items()}
    for number, entry in enumerate(sets):
        if all(fed.get(name) == [int(d) for d in shape] for name, shape in entry["inputs"].items()):
            return number
    differing = sorted({name for entry in sets for name, shape in entry["inputs"].items()
                        if len({tuple(e["inputs"][name]) for e in sets}) > 1})
    listed = "; ".join(", ".join(f"{name} {entry['inputs'][name]}" for name in differing) for entry in sets)
    raise ShapeRefused(f"{engine}: fed {', '.join(f'{name} {fed.get(name)}' for name in differing)}, which is not "
                       f"one of its {len(sets)} shape sets ({listed}); a ladder pads a chunk up to the next set")


def output_shapes(sets: List[dict], number: int) -> Dict[str, tuple]:
    return {name: tuple(shape) for name, shape in sets[number]["outputs"].items()}


def in_phases(contract: EngineContract, feeds: Dict[str, object]) -> Dict[str, object]:
    """`feeds` as the engine takes them: each input the contract's `input_phases` names, given as its T samples
    ([1, T] or [1, 1, T]), split into [1, P, T/P] with sample P*j + p at [p, j]; an input already at that shape, and
    every other input, as given."""
    phases_of = contract.input_phases or {}
    fed = dict(feeds)
    for name, phases in phases_of.items():
        samples = fed.get(name)
        if samples is None or (samples.ndim == 3 and samples.shape[1] == phases):
            continue
        if samples.shape[0] != 1 or samples.size % phases:
            raise ShapeRefused(f"input {name!r}: {samples.size} samples of shape {tuple(samples.shape)} do not split "
                               f"into {phases} phases of one batch")
        fed[name] = samples.reshape(-1, phases).T[None].copy()
    return fed
