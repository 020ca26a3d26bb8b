"""The engine manifest as a pydantic model: what `rkaudio.core.manifest.build_manifest` writes, checked before it is
written (`validate_manifest`), and the source of the schema HACKING.md shows (`tools/schema_blocks.py`).

Validate-only: the manifest stays the dict build_manifest makes (its key order is the file's), the model only says
what it must hold. Strict: a figure that JSON cannot hold as a number (inf, nan) is the string `json_safe` writes,
never a float (lax mode would read "inf" as a float, and a raw inf would be written as `Infinity`, which is no JSON).
Every model keeps keys it does not name (`extra="allow"`): manifests older or newer than this code still validate.
Fields that manifests built before them lack are optional (None when absent)."""
from __future__ import annotations

import typing
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt, ValidationError, create_model, field_validator

from rkaudio.board.contract import SHARED, EngineContract

# A figure that can be infinite or undefined: a number, or the string `rkaudio.board.numeric.json_safe` writes.
Figure = Union[StrictFloat, StrictInt, Literal["inf", "-inf", "nan"]]


class Entry(BaseModel):
    """An object of the manifest (or the self-test report): strict types, unknown keys kept."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class Tensor(Entry):
    """An engine input or output as its caller feeds or gets it."""

    name: str
    shape: List[int]
    dtype: str


class FileEntry(Entry):
    """A file: its path (relative to the manifest's folder when inside it), sha256 and size."""

    path: str
    sha256: str
    bytes: int


class EngineFile(FileEntry):
    """The engine's file entry: `normalized_sha256` is its digest with the producer commit masked."""

    normalized_sha256: str


class BuildStats(Entry):
    """The compiler child's peak resident memory, overall and per stage."""

    peak_rss_bytes: Optional[int] = None
    stage_peak_rss_bytes: Optional[Dict[str, int]] = None
    reproducible: Optional[str] = None


class RegtaskField(Entry):
    """A register field the compiler's REGTASK lines overflow: its lines and worst value."""

    target: str
    offset: str
    limit: int
    lines: int
    worst_value: int


class Regtask(Entry):
    """The build log's REGTASK lines (rkaudio.gates.regtask)."""

    lines: int
    worst_ratio: float
    fields: List[RegtaskField]


class CpuOp(Entry):
    name: str
    type: str
    rw_kb: Optional[float] = None  # its traffic (manifests before issue #42 have none)
    predicted_ms: Optional[float] = None  # its share of the board-time model's cpu_ops term


class Ops(Entry):
    """The layer table's op counts: on the NPU, CPU compute, CPU I/O glue."""

    npu: int
    cpu: int
    cpu_boundary: int
    layers: int
    cpu_ops: List[CpuOp]


class EngineIO(Entry):
    """The type the engine holds each input and output in ({name: type})."""

    inputs: Dict[str, str]
    outputs: Dict[str, str]


class BoardTimeTerms(Entry):
    """Milliseconds per term of the board-time model (rkaudio.gates.board_time)."""

    compute: float
    elementwise: float
    cpu_ops: float
    dispatch: float
    call_io: float


class CallFigures(Entry):
    """The figures the terms multiply."""

    cycles: int
    elementwise_bytes: int
    cpu_bytes: int
    layers: int
    io_tensors: int
    io_bytes: int


class Prediction(Entry):
    """The predicted board time of one call; `computed_by` names what computed it after the build."""

    ms: float
    terms: BoardTimeTerms
    figures: CallFigures
    basis: str
    computed_by: Optional[str] = None


class SimulatorFigures(Entry):
    """One output's simulator SNR and max|d| against onnxruntime fp32, and its fp16 floor."""

    snr_db: Figure
    max_abs: Figure
    fp16_floor_snr_db: Optional[Figure] = None
    fp16_floor_gap_db: Optional[Figure] = None


class Gate(Entry):
    """A gate's verdict (`rkaudio.board.verdict.Verdict.to_json`)."""

    name: str
    value: Figure
    threshold: Figure
    unit: str
    passed: bool
    detail: str
    bound: Literal["at_least", "at_most", ""] = ""
    advice: str = ""
    degenerate: str = ""


class PlanEntry(Entry):
    """The engine's component in the consumer's exec_plan: {option: {component: this}}."""

    impl: str
    artifacts: Dict[str, str]
    params: Optional[Dict[str, Any]] = None


_shared_types = typing.get_type_hints(EngineContract)
# The contract's shared fields typed as `EngineContract` declares them (`shape_set` is a view's, never written);
# the family's own fields sit beside them.
ContractEntry = create_model(
    "ContractEntry", __base__=Entry,
    __doc__="The engine contract (EngineContract.to_json): the shared fields; the family's own beside them.",
    **{name: (_shared_types[name], None) for name in SHARED if name != "shape_set"})


class ShapeSetEntry(Entry):
    """One shape set of a dynamic engine: its tensors, the contract fields it stands for, its own figures."""

    inputs: List[Tensor]
    outputs: List[Tensor]
    contract: Dict[str, Any]
    regtask: Regtask
    ops: Ops
    est_cycles: int
    rw_kb: float
    weight_bytes: int
    internal_bytes: int
    predicted_board_ms: Optional[Prediction]


class Manifest(Entry):
    """The manifest beside every engine (`<stem>.manifest.json`, rkaudio.core.manifest.build_manifest)."""

    family: Optional[str]
    component: Optional[str]
    role: Optional[str]
    target: str
    toolkit_version: str
    producer_version: Optional[str] = None
    producer_git: Optional[str] = None
    producer: Dict[str, str]
    inputs: List[Tensor]
    outputs: List[Tensor]
    onnx: FileEntry
    rknn: EngineFile
    build: BuildStats
    build_log: str
    regtask: Regtask
    ops: Ops
    engine_io: Optional[EngineIO] = None
    est_cycles: int
    rw_kb: float
    weight_bytes: int
    internal_bytes: int
    predicted_board_ms: Optional[Prediction] = None
    simulator: Dict[str, SimulatorFigures]
    gates: List[Gate]
    exec_plan: Dict[str, Dict[str, PlanEntry]]
    contract: ContractEntry
    shape_sets: Optional[List[ShapeSetEntry]] = None

    @field_validator("contract", mode="before")
    @classmethod
    def _reads_back_as_an_engine_contract(cls, data: Any) -> Any:
        """The contract `EngineContract.from_json` reads and `to_json` writes back unchanged (no shared field null)."""
        if isinstance(data, dict) and EngineContract.from_json(data).to_json() != data:
            raise ValueError("EngineContract does not write it back unchanged (a shared field is null)")
        return data


def schema_problems(model: type[BaseModel], data: Any) -> List[str]:
    """What keeps `data` from validating as `model`: one `field.path: message` per error ([] when it validates)."""
    try:
        model.model_validate(data)
    except ValidationError as error:
        return [f"{'.'.join(map(str, problem['loc'])) or '(top)'}: {problem['msg']}" for problem in error.errors()]
    return []


def validate_manifest(data: dict) -> dict:
    """`data`, checked against `Manifest`; a manifest that breaks it is a bug of its writer: ValueError naming each
    field."""
    problems = schema_problems(Manifest, data)
    if problems:
        raise ValueError("the manifest breaks its model (rkaudio.core.manifest_model.Manifest):\n  "
                         + "\n  ".join(problems))
    return data
