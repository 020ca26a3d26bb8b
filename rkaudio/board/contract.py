"""The engine contract, typed: what an exported ONNX carries in its metadata (`rkaudio`, one JSON object), what its
manifest repeats under `contract`, and what every later stage and the board runtime read back.

`EngineContract` holds the fields every family shares; a family's own fields stay in `fields`, verbatim, and are
read through the family's dataclass of `ContractFields` (`Audio8Fields.of(contract)`), never by key. `from_json` and
`to_json` here (and `read_fields`) are the only code that touches the JSON's keys; `to_json(from_json(d)) == d` for
every contract rkaudio writes, so packages published before keep reading, verifying and self-testing.
Shipped in the self-test kit: numpy and the stdlib only, Python 3.8 syntax."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union


def read_fields(cls, values: Mapping[str, Any], given: Mapping[str, Any]):
    """The dataclass `cls` with each field not `given` read from `values` under its own name: int fields as int, an
    absent field at its default, an absent field without one a ValueError naming it."""
    kwargs = dict(given)
    for entry in dataclasses.fields(cls):
        if entry.name in kwargs or not entry.init:
            continue
        if entry.name not in values:
            if entry.default is dataclasses.MISSING and entry.default_factory is dataclasses.MISSING:
                raise ValueError(f"the engine contract has no field {entry.name!r} ({cls.__name__}); "
                                 f"was it exported by the family that reads it?")
            continue
        value = values[entry.name]
        kwargs[entry.name] = int(value) if entry.type in (int, "int") else value
    return cls(**kwargs)


class ContractFields:
    """A family's own contract fields as a dataclass: subclass it with `@dataclass(frozen=True)` and read it with
    `of(contract)` (fields not in the contract at their defaults)."""

    @classmethod
    def of(cls, contract: "EngineContract", **given):
        return read_fields(cls, contract.fields, given)

    def to_fields(self) -> Dict[str, Any]:
        """The contract fields an exporter stores: every field, a None one too (present as null in the JSON)."""
        return {entry.name: getattr(self, entry.name) for entry in dataclasses.fields(self)}


@dataclass(frozen=True)
class EngineContract:
    """The contract's shared fields (None: absent from the JSON) and the family's own (`fields`)."""

    family: Optional[str] = None            # the family as contracts name it (`Family.contract_name`)
    component: Optional[str] = None         # the exec_plan component the engine belongs to
    role: Optional[str] = None              # the engine's role in its component ("main", "step", "window", ...)
    exec_plan_option: Optional[str] = None  # the consumer's exec_plan option the component is switched by
    producer: Optional[Dict[str, str]] = None          # {rkaudio, git, command} of the export
    ladder_key: Union[int, float, None] = None         # the engine's place in its ladder (a length, a bucket)
    exec_params: Optional[Dict[str, Any]] = None       # exec_plan parameters the package states for the engine
    package_files: Optional[List[str]] = None          # files the package ships beside the engine
    feed_dtypes: Optional[Dict[str, str]] = None       # {input: numpy dtype} the runtime feeds instead of the ONNX's
    reference_onnx: Optional[str] = None               # the ONNX the engine's goldens and checks are judged against
    export_verdicts: Optional[List[Dict[str, Any]]] = None  # the export stage's verdicts (Verdict JSON)
    shape_sets: Optional[List[Dict[str, Any]]] = None  # a dynamic ladder's sets: {inputs, outputs, contract}
    ladder: Optional[str] = None                       # "dynamic" for an engine of several shape sets
    stages: Optional[Dict[str, str]] = None            # {layer-name prefix: stage label} for per-stage diagnosis
    shape_set: Optional[int] = None                    # the set a view of a dynamic engine stands for
    input_phases: Optional[Dict[str, int]] = None      # {input: P}: fed as [1, P, T/P], sample P*j+p at [p, j]
    fields: Mapping[str, Any] = field(default_factory=dict)  # the family's own fields, verbatim

    @classmethod
    def from_json(cls, data: Optional[Mapping[str, Any]]) -> "EngineContract":
        """The contract of its JSON object (a foreign ONNX's `{}` or None gives an empty contract)."""
        data = dict(data or {})
        shared = {name: data.pop(name) for name in SHARED if name in data}
        return cls(**shared, fields=data)

    def to_json(self) -> Dict[str, Any]:
        """The JSON object, keys sorted as every writer stores it (`json.dumps(..., sort_keys=True)`)."""
        shared = {name: getattr(self, name) for name in SHARED if getattr(self, name) is not None}
        clash = sorted(set(SHARED) & set(self.fields))
        if clash:
            raise ValueError(f"contract fields {clash} are shared fields; set them as such")
        return dict(sorted({**shared, **self.fields}.items()))

    @property
    def empty(self) -> bool:
        """True for the contract of an ONNX that rkaudio did not write."""
        return not self.to_json()

    @property
    def ladder_order(self) -> Union[int, float]:
        """Where the engine sorts among the engines of its role: its `ladder_key`, 0 without one (an engine alone
        in its role needs none; a packaged ladder whose engines lack one is refused before it is sorted)."""
        return 0 if self.ladder_key is None else self.ladder_key

    def replace(self, **changes) -> "EngineContract":
        """A copy with shared fields changed."""
        return dataclasses.replace(self, **changes)

    def with_fields(self, **changes) -> "EngineContract":
        """A copy with family fields changed or added."""
        return dataclasses.replace(self, fields={**self.fields, **changes})

    def views(self) -> List["EngineContract"]:
        """One contract per shape set (the engine's, with that set's own fields and `shape_set`), or this contract
        itself for a fixed-shape engine."""
        if not self.shape_sets:
            return [self]
        base = self.to_json()
        return [EngineContract.from_json({**base, **entry["contract"]}).replace(shape_set=number)
                for number, entry in enumerate(self.shape_sets)]


SHARED = tuple(entry.name for entry in dataclasses.fields(EngineContract) if entry.name != "fields")
